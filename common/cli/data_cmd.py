"""`starling fts rebuild`, and the check that the writer runs, for maintenance it does on request."""

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
REBUILD_TIMEOUT_S = 3600.0


def register(verbs) -> None:
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
