"""`starling backup create|verify|list|restore`: whole-home archives (common/backup.py); the database part is
the running writer's online backup, asked for over the bus."""

from __future__ import annotations

import argparse
import fcntl
import os
import time
from pathlib import Path

from common import backup
from common.cli import output
from common.cli.context import Context
from common.cli.data_cmd import require_writer
from common.errors import StarlingError
from common.home import Paths, make_private_dir, resolve_home
from common.supervisor import Supervisor
from schema import messages as m

BACKUP_TIMEOUT_S = 3600.0


def register(verbs) -> None:
    top = verbs.add_parser(
        "backup", help="archives of the whole home: create, verify, list, restore",
        description="An archive (0600, gzipped tar) holds the database (the writer's online copy: writes go on"
                    " meanwhile), config.toml, agents/, secrets.json, .session-secret, .control-token and the"
                    " WhatsApp sessions, with a manifest of SHA-256 checksums.",
    )
    actions = top.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="write an archive of this home (the writer must be running)",
                                description="PATH is a file or a folder; default data/backups/. In a folder, the"
                                            " newest [backup] keep archives are kept and older ones deleted.")
    create.add_argument("path", metavar="PATH", nargs="?", help="the archive, or a folder for it")
    create.add_argument("--verify", action="store_true", help="read the archive back and check it")
    create.add_argument("--json", action="store_true", help="print JSON for scripts")
    create.set_defaults(func=cmd_create)
    check = actions.add_parser("verify", help="check an archive: every checksum, and the database's integrity")
    check.add_argument("path", metavar="PATH")
    check.add_argument("--json", action="store_true", help="print JSON for scripts")
    check.set_defaults(func=cmd_verify)
    listing = actions.add_parser("list", help="the archives in data/backups/ (or FOLDER), newest first")
    listing.add_argument("folder", metavar="FOLDER", nargs="?")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(func=cmd_list)
    restore = actions.add_parser(
        "restore", help="restore an archive into a new or stopped home",
        description="Refuses a home where Starling runs, and one that has a database unless --force. The"
                    " archive is checked as it is unpacked and the database with integrity_check before"
                    " anything is put in place.")
    restore.add_argument("path", metavar="PATH")
    restore.add_argument("--home", default=argparse.SUPPRESS, help="the home to restore into (default: as for"
                                                                    " every verb)")
    restore.add_argument("--force", action="store_true", help="replace a stopped home's database and files")
    restore.set_defaults(func=cmd_restore)


def _size(nbytes: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1024 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} GB"


def _summary(manifest: backup.Manifest) -> str:
    names = manifest.files
    agents = {n.split("/")[1] for n in names if n.startswith("agents/")}
    sessions = {n.split("/")[2] for n in names if n.startswith("data/whatsapp/")}
    parts = [f"database {_size(names[backup.DB_NAME][0])} (schema {manifest.schema_version})", "config.toml"]
    parts += [n.removeprefix("data/") for n in names if n.removeprefix("data/") in backup.DATA_FILES]
    parts.append(f"{len(agents)} agent{'s' if len(agents) != 1 else ''}")
    if sessions:
        parts.append(f"{len(sessions)} WhatsApp session{'s' if len(sessions) != 1 else ''}")
    return f"{len(names)} files: " + ", ".join(parts)


def _target(ctx: Context, given: str | None) -> tuple[Path, bool]:
    """(the archive's path, whether it is in a folder whose old archives are pruned)."""
    if given is None:
        folder = ctx.paths.data_dir / "backups"
    else:
        path = Path(given).expanduser().absolute()
        if not (path.is_dir() or given.endswith("/")):
            if path.exists():
                raise StarlingError(f"{path} exists; choose another PATH")
            make_private_dir(path.parent)
            return path, False
        folder = path
    make_private_dir(folder)
    return backup.default_name(folder), True


def cmd_create(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    target, in_folder = _target(ctx, args.path)
    require_writer(ctx)
    started = time.monotonic()
    copy = target.with_name(f".{target.name}.db")  # the writer's copy; the writer runs as us, on this host
    progress = output.Progress(f"backing up to {target}")
    try:
        result = ctx.call(m.Backup(path=str(copy)), timeout_s=BACKUP_TIMEOUT_S, on_wait=progress.update, long=True)
        if not isinstance(result, m.BackedUp):
            raise StarlingError(f"the writer answered the backup with {type(result).__name__}, not BackedUp")
        if Path(result.path) != copy:  # the writer runs one backup at a time and answered another's
            raise StarlingError("another backup was being made at the same time; try again when it is done")
        manifest = backup.write_archive(target, backup.collect(ctx.paths, copy), ctx.home, backup.schema_of(copy))
    finally:
        progress.finish()
        copy.unlink(missing_ok=True)
    verified = None
    if args.verify:
        backup.verify(target)  # raises BackupError, naming what is wrong
        verified = True
    removed = backup.prune(target.parent, ctx.cfg.backup.keep) if in_folder else []
    seconds = time.monotonic() - started
    if args.json:
        output.emit_json({"path": str(target), "bytes": target.stat().st_size, "files": len(manifest.files),
                          "schema_version": manifest.schema_version, "seconds": seconds, "verified": verified,
                          "removed": [str(p) for p in removed]})
    else:
        print(f"backup written: {target}")
        print(f"  {_size(target.stat().st_size)}; {_summary(manifest)}; {seconds:.2f} s")
        if verified:
            print("  verified: every checksum matches, integrity_check ok")
        for old in removed:
            print(f"  removed old backup {old.name} ([backup] keep = {ctx.cfg.backup.keep})")
    if not manifest.session_secret:
        output.warn("the session secret comes from $SESSION_SECRET, so it is not in the archive: keep it with the"
                    " backup (the bus key and WhatsApp sessions derive from it)")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    path = Path(args.path).expanduser().absolute()
    if not path.is_file():
        raise StarlingError(f"{path}: no such file")
    try:
        manifest = backup.verify(path)
    except backup.BackupError as exc:
        if args.json:
            output.emit_json({"path": str(path), "ok": False, "error": str(exc)})
            return 1
        raise
    if args.json:
        output.emit_json({"path": str(path), "ok": True, "files": len(manifest.files),
                          "schema_version": manifest.schema_version, "created_at": manifest.created_at})
        return 0
    print(f"{path}: ok")
    print(f"  made {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(manifest.created_at))} from {manifest.home}")
    print(f"  {_summary(manifest)}; every checksum matches, integrity_check ok")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    if args.folder:
        folder = Path(args.folder).expanduser().absolute()
    else:
        folder = Context.from_args(args).paths.data_dir / "backups"
    rows = []
    archives = [p for p in folder.glob("*.tar.gz") if p.is_file()] if folder.is_dir() else []
    for path in archives:
        try:
            manifest = backup.read_manifest(path)
            rows.append({"path": str(path), "created_at": manifest.created_at, "bytes": path.stat().st_size,
                         "files": len(manifest.files), "schema_version": manifest.schema_version, "error": ""})
        except backup.BackupError as exc:
            rows.append({"path": str(path), "created_at": None, "bytes": path.stat().st_size, "files": None,
                         "schema_version": None, "error": str(exc).removeprefix(f"{path}: ")})
    rows.sort(key=lambda r: r["created_at"] or 0, reverse=True)
    if args.json:
        output.emit_json(rows)
        return 0
    if not rows:
        print(f"no backups in {folder} (`starling backup create`)")
        return 0
    print(output.table(
        ["BACKUP", "MADE", "SIZE", "FILES", "SCHEMA"],
        [[Path(r["path"]).name,
          time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created_at"])) if r["created_at"] else r["error"],
          _size(r["bytes"]), r["files"] if r["files"] is not None else "-",
          r["schema_version"] if r["schema_version"] is not None else "-"] for r in rows]))
    print(f"\n{len(rows)} in {folder}; `starling backup verify PATH` checks one")
    return 0


def running_reason(paths: Paths) -> str | None:
    """Why a home must not be restored into now: its supervisord, or a writer holding its lock."""
    sup = Supervisor(paths)
    if sup.reachable():
        return f"Starling is running there (supervisord pid {sup.supervisord_pid()})"
    lock = paths.run_dir / "writer.lock"
    if not lock.exists():
        return None
    fd = os.open(lock, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        return f"a writer is running on its database (pid {holder})"
    finally:
        os.close(fd)
    return None


def cmd_restore(args: argparse.Namespace) -> int:
    archive = Path(args.path).expanduser().absolute()
    if not archive.is_file():
        raise StarlingError(f"{archive}: no such file")
    home = resolve_home(args.home)
    started = time.monotonic()
    done = backup.restore(archive, home, force=args.force, refuse=running_reason)
    print(f"restored {archive.name} into {done.home} in {time.monotonic() - started:.2f} s")
    print(f"  {done.files} files; database integrity_check {done.integrity};"
          f" agents: {', '.join(done.agents) or 'none'}"
          + (f"; WhatsApp sessions: {', '.join(done.whatsapp)}" if done.whatsapp else ""))
    flag = "" if args.home is None else f" --home {home}"
    print(f"Next: `starling{flag} doctor`, then `starling{flag} up`.")
    return 0
