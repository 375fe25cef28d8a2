"""Backup archives of a home: what goes in, the manifest and its checksums, verifying, restoring, retention.

An archive is one gzipped tar file, 0600 from its first byte, written beside its final name and renamed
into place once complete and fsynced. Its first member is `manifest.json`: the format and version, when
and from which home it was made, the database's schema version, and every other member's name, size
and SHA-256. The members, by their place in a home (whatever data_dir and agents_dir are configured to):

    config.toml
    data/starling.db            the writer's online copy (common/cli/backup_cmd.py asks for it)
    data/secrets.json           data/.session-secret  data/.control-token   (those that exist)
    data/whatsapp/<instance>/…  linked-device sessions (their key derives from .session-secret)
    agents/<id>/…               every persona pack

Only regular files are archived and restored; a member that the manifest does not list, a name that
is absolute or climbs out (`..`), a link or a device, a size or checksum that differs: each makes the
archive invalid, and nothing of it is restored.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import tarfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Callable, Iterable

import apsw

from common import db
from common.config import load_config
from common.errors import ConfigError, StarlingError
from common.home import FILE_MODE, Paths, ensure_layout, fsync_dir, make_private_dir, paths_for
from common.stores import db_store, schema_store

FORMAT = "starling-backup"
VERSION = 1
MANIFEST = "manifest.json"
DB_NAME = "data/starling.db"
DATA_FILES = ("secrets.json", ".session-secret", ".control-token")
NAME_PATTERN = re.compile(r"^starling-\d{8}-\d{6}(?:-\d+)?\.tar\.gz$")
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
CHUNK = 1024 * 1024

Source = Path | bytes  # a file to stream (the database copy), or bytes read once (small live files)


class BackupError(StarlingError):
    """An archive that cannot be used: damaged, altered, incomplete, or not a Starling backup."""


@dataclass(frozen=True)
class Manifest:
    created_at: float
    home: str
    schema_version: int
    session_secret: bool  # whether data/.session-secret is inside (WhatsApp sessions need it)
    files: dict[str, tuple[int, str]]  # name -> (size, sha256 hex)

    def to_json(self) -> bytes:
        return json.dumps({
            "format": FORMAT, "version": VERSION, "created_at": self.created_at, "home": self.home,
            "schema_version": self.schema_version, "session_secret": self.session_secret,
            "files": [{"name": n, "size": s, "sha256": h} for n, (s, h) in self.files.items()],
        }, indent=2).encode()

    @classmethod
    def from_json(cls, raw: bytes, archive: Path) -> Manifest:
        try:
            data = json.loads(raw)
            if data.get("format") != FORMAT:
                raise BackupError(f"{archive}: not a Starling backup (manifest format {data.get('format')!r})")
            if data.get("version") != VERSION:
                raise BackupError(f"{archive}: backup format version {data.get('version')!r}; this Starling"
                                  f" reads version {VERSION}")
            files = {str(f["name"]): (int(f["size"]), str(f["sha256"])) for f in data["files"]}
            return cls(float(data["created_at"]), str(data["home"]), int(data["schema_version"]),
                       bool(data["session_secret"]), files)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise BackupError(f"{archive}: the manifest is not valid ({type(exc).__name__}: {exc})") from None


@dataclass(frozen=True)
class Restored:
    home: Path
    files: int
    agents: list[str]
    whatsapp: list[str]
    integrity: str  # "ok"


# ------------------------------------------------------------------ what goes in


def _safe_name(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name


def _tree(folder: Path, prefix: str, skip: Callable[[Path], bool]) -> list[tuple[str, Source]]:
    """Regular files under ``folder`` (symlinks not followed), as (prefix/relative path, bytes)."""
    found: list[tuple[str, Source]] = []
    if not folder.is_dir():
        return found
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            path = Path(root) / name
            rel = path.relative_to(folder)
            if path.is_symlink() or not path.is_file() or skip(rel):
                continue
            try:
                found.append((f"{prefix}/{rel.as_posix()}", path.read_bytes()))
            except FileNotFoundError:  # removed meanwhile (a session value replaced)
                continue
    return found


def collect(paths: Paths, db_copy: Path) -> list[tuple[str, Source]]:
    """Every member of an archive of this home but the manifest, in archive order."""
    items: list[tuple[str, Source]] = [("config.toml", paths.config_file.read_bytes()), (DB_NAME, db_copy)]
    for name in DATA_FILES:
        file = paths.data_dir / name
        if file.is_file():
            items.append((f"data/{name}", file.read_bytes()))
    # a session's lock and a write's leftover temporary file are not part of it
    items += _tree(paths.whatsapp_dir, "data/whatsapp",
                   lambda rel: rel.name == ".lock" or rel.name.endswith(".tmp"))
    # a pack being created (agents/.<id>.<hex>.new) is not a pack yet
    items += _tree(paths.agents_dir, "agents", lambda rel: rel.parts[0].startswith("."))
    return items


def _digest(source: Source) -> tuple[int, str]:
    if isinstance(source, bytes):
        return len(source), hashlib.sha256(source).hexdigest()
    h, size = hashlib.sha256(), 0
    with open(source, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _member(name: str, size: int, mtime: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, FILE_MODE, int(mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_archive(target: Path, items: Iterable[tuple[str, Source]], home: Path, schema_version: int) -> Manifest:
    """Write the archive at ``target`` (0600; complete or absent); returns its manifest."""
    items = list(items)
    files = {name: _digest(source) for name, source in items}
    now = time.time()
    manifest = Manifest(now, str(home), schema_version, "data/.session-secret" in files, files)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as raw:
            os.fchmod(raw.fileno(), FILE_MODE)
            with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=6) as tar:
                body = manifest.to_json()
                tar.addfile(_member(MANIFEST, len(body), now), io.BytesIO(body))
                for name, source in items:
                    size = files[name][0]
                    if isinstance(source, bytes):
                        tar.addfile(_member(name, size, now), io.BytesIO(source))
                    else:
                        with open(source, "rb") as f:
                            tar.addfile(_member(name, size, now), f)
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return manifest


def default_name(folder: Path) -> Path:
    """folder/starling-YYYYmmdd-HHMMSS.tar.gz, with -N added when that name is taken."""
    stem = f"starling-{time.strftime('%Y%m%d-%H%M%S')}"
    target, n = folder / f"{stem}.tar.gz", 0
    while target.exists():
        n += 1
        target = folder / f"{stem}-{n}.tar.gz"
    return target


def prune(folder: Path, keep: int) -> list[Path]:
    """Delete the oldest archives (by their names' times) past the newest ``keep``; 0 keeps all."""
    if keep <= 0:
        return []
    archives = sorted((p for p in folder.iterdir() if NAME_PATTERN.match(p.name) and p.is_file()),
                      key=lambda p: (p.name[:24], len(p.name), p.name))
    removed = archives[:-keep] if len(archives) > keep else []
    for old in removed:
        old.unlink(missing_ok=True)
    if removed:
        fsync_dir(folder)
    return removed


# ------------------------------------------------------------------ reading an archive


def read_manifest(archive: Path) -> Manifest:
    """The manifest alone (cheap: the first member); BackupError when it cannot be read."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            return _manifest(tar, archive)
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BackupError(f"{archive}: cannot read: {exc}") from None


def _manifest(tar: tarfile.TarFile, archive: Path) -> Manifest:
    first = tar.next()
    if first is None or first.name != MANIFEST or not first.isfile() or first.size > MAX_MANIFEST_BYTES:
        raise BackupError(f"{archive}: not a Starling backup (its first member is not {MANIFEST})")
    return Manifest.from_json(tar.extractfile(first).read(), archive)


def _read(archive: Path, sink: Callable[[str], BinaryIO | None]) -> Manifest:
    """Walk every member, checking it against the manifest as it streams; ``sink(name)`` may return a
    file to copy the member into (closed by the caller). Raises BackupError at the first problem."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            manifest = _manifest(tar, archive)
            seen: set[str] = set()
            for member in tar:  # from the first member again: the manifest is skipped by its place
                name = member.name
                if member.offset == 0:
                    continue
                if not member.isfile():
                    raise BackupError(f"{archive}: {name!r} is not a regular file; a backup holds only files")
                if name not in manifest.files or not _safe_name(name):
                    raise BackupError(f"{archive}: {name!r} is not in the manifest")
                if name in seen:
                    raise BackupError(f"{archive}: {name!r} appears twice")
                seen.add(name)
                out = sink(name)
                h, size, f = hashlib.sha256(), 0, tar.extractfile(member)
                while chunk := f.read(CHUNK):
                    h.update(chunk)
                    size += len(chunk)
                    if out is not None:
                        out.write(chunk)
                want_size, want_sha = manifest.files[name]
                if (size, h.hexdigest()) != (want_size, want_sha):
                    raise BackupError(f"{archive}: {name} does not match its checksum in the manifest"
                                      " (the archive was altered or damaged)")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise BackupError(f"{archive}: damaged: {exc}") from None
    missing = sorted(set(manifest.files) - seen)
    if missing:
        raise BackupError(f"{archive}: incomplete: {', '.join(missing[:5])} missing")
    if DB_NAME not in manifest.files or "config.toml" not in manifest.files:
        raise BackupError(f"{archive}: holds no {DB_NAME if DB_NAME not in manifest.files else 'config.toml'}")
    return manifest


def check_db_copy(db_file: Path, label: str) -> str:
    """A full integrity_check of a database copy; "ok" or BackupError naming ``label``."""
    try:
        conn = db.open_reader(db_file)
        try:
            with db.read_tx(conn):
                problems = db_store.integrity_check(conn)
        finally:
            conn.close()
    except apsw.Error as exc:
        raise BackupError(f"{label}: the database does not open: {exc}") from None
    if problems != ["ok"]:
        raise BackupError(f"{label}: integrity_check: {'; '.join(problems[:3])}")
    return "ok"


def schema_of(db_file: Path) -> int:
    conn = db.open_reader(db_file)
    try:
        with db.read_tx(conn):
            return schema_store.version(conn)
    finally:
        conn.close()


def verify(archive: Path, scratch: Path | None = None) -> Manifest:
    """Every checksum, then integrity_check of the database inside (copied to a scratch folder)."""
    work = Path(scratch or archive.parent) / f".verify-{secrets.token_hex(4)}"
    make_private_dir(work)
    try:
        copy = work / "starling.db"
        with open(copy, "wb") as out:
            manifest = _read(archive, lambda name: out if name == DB_NAME else None)
        check_db_copy(copy, str(archive))
        return manifest
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ------------------------------------------------------------------ restoring


def _extract(archive: Path, staging: Path) -> Manifest:
    opened: list[BinaryIO] = []

    def sink(name: str) -> BinaryIO:
        for f in opened:
            f.close()
        opened.clear()
        path = staging / name
        make_private_dir(path.parent)
        f = open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE), "wb")
        opened.append(f)
        return f

    try:
        return _read(archive, sink)
    finally:
        for f in opened:
            f.close()


def restore(archive: Path, home: Path, force: bool = False,
            refuse: Callable[[Paths], str | None] = lambda paths: None) -> Restored:
    """Restore ``archive`` into ``home``: checked member by member as it is unpacked into a staging folder,
    the database checked with integrity_check, then moved into place. ``refuse(paths)`` names a reason not
    to touch a home (Starling running there); a home that has a database is replaced only with ``force``."""
    home = Path(home).absolute()
    if (home / "config.toml").exists():
        try:
            _refuse_home(paths_for(home, load_config(home / "config.toml")), force, refuse)
        except ConfigError:
            if not force:
                raise StarlingError(f"{home}/config.toml does not load; pass --force to replace it with the"
                                    " backup's") from None
    make_private_dir(home)
    staging = home / f".restore-{secrets.token_hex(4)}"
    make_private_dir(staging)
    try:
        manifest = _extract(archive, staging)
        integrity = check_db_copy(staging / DB_NAME, str(archive))
        known = schema_store.code_version()
        if manifest.schema_version > known:
            raise BackupError(f"{archive}: its database is at schema version {manifest.schema_version}; this"
                              f" Starling knows {known}: restore it with a Starling as new as the one that made it")
        try:
            cfg = load_config(staging / "config.toml")
        except ConfigError as exc:
            raise BackupError(f"{archive}: its config.toml does not load here: {exc}") from None
        paths = paths_for(home, cfg)
        _refuse_home(paths, force, refuse)  # data_dir may live elsewhere: look there too
        _move(staging / "config.toml", paths.config_file)
        ensure_layout(paths)
        agents, sessions = _place(staging, paths)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Restored(home, len(manifest.files), agents, sessions, integrity)


def _refuse_home(paths: Paths, force: bool, refuse: Callable[[Paths], str | None]) -> None:
    reason = refuse(paths)
    if reason:
        raise StarlingError(f"{paths.home}: {reason}; stop it first (`starling down`), or restore into a new home")
    if paths.db_file.exists() and not force:
        raise StarlingError(f"{paths.home} already holds a Starling database ({paths.db_file}); restore into a new"
                            " folder (`--home NEW`), or pass --force to replace its database, config, secrets,"
                            " agents and WhatsApp sessions with the backup's")


def _move(source: Path, target: Path) -> None:
    """Rename ``source`` (a file or a folder) to ``target``; across file systems (data_dir on another disk),
    copy it beside ``target`` first and rename that, so ``target`` is never seen half made."""
    try:
        os.replace(source, target)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.restoring")
    if source.is_dir():
        shutil.copytree(source, temp, symlinks=False)
    else:
        shutil.copyfile(source, temp)
        os.chmod(temp, FILE_MODE)
    os.replace(temp, target)


def _place(staging: Path, paths: Paths) -> tuple[list[str], list[str]]:
    """Move the staged files into the home: the database first without the old WAL (it belongs to the
    replaced file), then secrets, sessions and packs (each pack and session folder replaced whole)."""
    for suffix in ("-wal", "-shm", "-journal"):
        Path(str(paths.db_file) + suffix).unlink(missing_ok=True)
    _move(staging / DB_NAME, paths.db_file)
    db.refusal_file(paths.db_file).unlink(missing_ok=True)
    for name in DATA_FILES:
        if (staging / "data" / name).exists():
            _move(staging / "data" / name, paths.data_dir / name)
    sessions = _replace_children(staging / "data/whatsapp", paths.whatsapp_dir)
    agents = _replace_children(staging / "agents", paths.agents_dir)
    for agent in agents:
        for folder in (paths.private_workspace(agent), paths.private_workspace(agent) / ".scratchpad"):
            make_private_dir(folder)
        make_private_dir(paths.agents_dir / agent / "skills")
    for folder in (paths.data_dir, paths.whatsapp_dir, paths.agents_dir):
        fsync_dir(folder)
    return agents, sessions


def _replace_children(source: Path, target: Path) -> list[str]:
    if not source.is_dir():
        return []
    names = sorted(p.name for p in source.iterdir() if p.is_dir())
    for name in names:
        old = target / name
        if old.exists():
            aside = target / f".{name}.replaced-{secrets.token_hex(4)}"
            os.rename(old, aside)
            shutil.rmtree(aside, ignore_errors=True)
        _move(source / name, old)
    return names
