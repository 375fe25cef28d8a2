"""`starling backup [PATH]` and `starling fts rebuild`: maintenance the running writer does on request."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from common import db
from common.cli import output
from common.cli.context import Context
from common.errors import StarlingError
from common.stores import recall_store, turn_store
from schema import messages as m

PING_TIMEOUT_S = 3.0
BACKUP_TIMEOUT_S = 3600.0
REBUILD_TIMEOUT_S = 3600.0


def register(verbs) -> None:
    backup = verbs.add_parser(
        "backup", help="write a consistent copy of the database while Starling runs",
        description="The writer copies the database online (writes go on meanwhile) to PATH, "
                    "default data/backups/starling-YYYYmmdd-HHMMSS.db. The writer must be running.",
    )
    backup.add_argument("path", metavar="PATH", nargs="?", help="where to write the copy")
    backup.add_argument("--force", action="store_true", help="replace PATH if it exists")
    backup.add_argument("--json", action="store_true", help="print JSON for scripts")
    backup.set_defaults(func=cmd_backup)

    fts = verbs.add_parser("fts", help="the full-text recall index")
    actions = fts.add_subparsers(dest="action", metavar="ACTION", required=True)
    rebuild = actions.add_parser("rebuild", help="rebuild the recall index from every turn (the writer must run)")
    rebuild.add_argument("--json", action="store_true", help="print JSON for scripts")
    rebuild.set_defaults(func=cmd_fts_rebuild)


def require_writer(ctx: Context) -> None:
    """Fail fast and clearly when no writer answers, instead of waiting out a long deadline."""
    endpoint = ctx.endpoints.writer
    if endpoint.startswith("ipc://") and not Path(endpoint[len("ipc://"):]).exists():
        raise StarlingError(f"the writer is not running (no socket at {endpoint[len('ipc://'):]});"
                            " start Starling with `starling up`")
    ctx.call(m.Ping(), timeout_s=PING_TIMEOUT_S)


def _size(nbytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GB"


def cmd_backup(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    if args.path:
        target = Path(args.path).expanduser().absolute()  # the writer runs elsewhere: never send a relative path
        if target.is_dir():
            target = target / f"starling-{time.strftime('%Y%m%d-%H%M%S')}.db"
    else:
        target = ctx.paths.data_dir / "backups" / f"starling-{time.strftime('%Y%m%d-%H%M%S')}.db"
    try:
        db.check_backup_target(target, ctx.paths.db_file)
    except ValueError as exc:
        raise StarlingError(str(exc)) from None
    if target.exists() and not args.force:
        raise StarlingError(f"{target} exists; choose another PATH or pass --force")
    require_writer(ctx)
    progress = output.Progress(f"backing up to {target}")
    try:
        result = ctx.call(m.Backup(path=str(target)), timeout_s=BACKUP_TIMEOUT_S, on_wait=progress.update, long=True)
    finally:
        progress.finish()
    if not isinstance(result, m.BackedUp):
        raise StarlingError(f"the writer answered the backup with {type(result).__name__}, not BackedUp")
    size = Path(result.path).stat().st_size
    if args.json:
        output.emit_json({"path": result.path, "bytes": size, "pages": result.pages, "seconds": result.seconds})
        return 0
    print(f"backup written: {result.path}")
    print(f"  {_size(size)}, {result.pages} pages, {result.seconds:.2f} s")
    return 0


def cmd_fts_rebuild(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    require_writer(ctx)
    started = time.monotonic()
    progress = output.Progress("rebuilding the recall index")
    try:
        ctx.call(m.FtsRebuild(), timeout_s=REBUILD_TIMEOUT_S, on_wait=progress.update, long=True)
    finally:
        progress.finish()
    seconds = time.monotonic() - started
    conn = ctx.reader()
    try:
        with db.read_tx(conn):
            turns = turn_store.count(conn)
            complete = not recall_store.needs_backfill(conn)
    finally:
        conn.close()
    if args.json:
        output.emit_json({"indexed_turns": turns, "complete": complete, "seconds": seconds})
        return 0 if complete else 1
    print(f"recall index rebuilt: {turns} turns indexed in {seconds:.2f} s")
    if not complete:
        output.warn("the index does not hold every turn; run `starling fts rebuild` again")
        return 1
    return 0
