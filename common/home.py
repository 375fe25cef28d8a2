"""Where Starling's state lives on disk: the home folder, derived paths, layout and private files."""

from __future__ import annotations

import errno
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from common.config import ID_PATTERN, Config
from common.errors import StarlingError

DIR_MODE = 0o700
FILE_MODE = 0o600
_ID = re.compile(ID_PATTERN)


def resolve_home(arg: str | None) -> Path:
    """--home, else $STARLING_HOME, else ./.starling; always absolute (symlinks are kept)."""
    raw = arg or os.environ.get("STARLING_HOME") or ".starling"
    return Path(raw).expanduser().absolute()


def _resolve(home: Path, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else home / path


@dataclass(frozen=True)
class Paths:
    """Every path a process needs, resolved once from the home folder and the config."""

    home: Path
    config_file: Path
    data_dir: Path
    agents_dir: Path
    workspace_dir: Path
    memories_dir: Path
    memories_enabled: bool

    @property
    def db_file(self) -> Path:
        return self.data_dir / "starling.db"

    @property
    def secrets_file(self) -> Path:
        return self.data_dir / "secrets.json"

    @property
    def control_token_file(self) -> Path:
        return self.data_dir / ".control-token"

    @property
    def session_secret_file(self) -> Path:
        return self.data_dir / ".session-secret"

    @property
    def credentials_dir(self) -> Path:
        return self.data_dir / "credentials"

    @property
    def attachments_dir(self) -> Path:
        return self.data_dir / "attachments"

    @property
    def whatsapp_dir(self) -> Path:
        return self.data_dir / "whatsapp"

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def tool_output_dir(self) -> Path:
        return self.data_dir / "tool-output"

    @property
    def backups_dir(self) -> Path:
        return self.data_dir / "backups" / "agents"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def run_dir(self) -> Path:
        return self.data_dir / "run"

    @property
    def spool_dir(self) -> Path:
        """Gateways' spools of events acknowledged before the writer stored them (services/gateway/spool.py)."""
        return self.data_dir / "spool"

    @property
    def dead_letters_dir(self) -> Path:
        """Dead letters the writer could not take (services/gateway/dead_letters.py)."""
        return self.data_dir / "dead-letters"

    @property
    def shared_workspace(self) -> Path:
        return self.workspace_dir / "shared"

    @property
    def private_root(self) -> Path:
        return self.workspace_dir / "private"

    def private_workspace(self, agent_id: str) -> Path:
        if not _ID.match(agent_id):
            raise ValueError(f"invalid agent id {agent_id!r}")
        return self.private_root / agent_id

    def layout(self) -> list[Path]:
        """The folders ensure_layout creates, parents first."""
        dirs = [
            self.home,
            self.data_dir,
            self.credentials_dir,
            self.attachments_dir,
            self.whatsapp_dir,
            self.jobs_dir,
            self.tool_output_dir,
            self.backups_dir.parent,
            self.backups_dir,
            self.logs_dir,
            self.run_dir,
            self.agents_dir,
            self.workspace_dir,
            self.shared_workspace,
            self.private_root,
        ]
        if self.memories_enabled:
            dirs.append(self.memories_dir)
        return dirs


def paths_for(home: Path, cfg: Config) -> Paths:
    """Resolve the config's folders; relative ones are relative to home, the config file's folder."""
    home = Path(home).absolute()
    active = cfg.session_memory.active_dir
    return Paths(
        home=home,
        config_file=home / "config.toml",
        data_dir=_resolve(home, cfg.data_dir),
        agents_dir=_resolve(home, cfg.agents_dir),
        workspace_dir=_resolve(home, cfg.workspace_dir),
        memories_dir=_resolve(home, active) if active else home / "memories",
        memories_enabled=bool(active),
    )


def ensure_layout(paths: Paths) -> None:
    """Create the state tree at mode 0700, tightening folders that exist looser. Idempotent."""
    for folder in paths.layout():
        try:
            make_private_dir(folder)
        except OSError as e:
            raise StarlingError(f"{folder}: cannot create or secure folder: {e.strerror}") from None


def fsync_dir(folder: Path) -> None:
    """Make the folder's entries durable: a file renamed, linked or removed in it, a folder made in it."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private_dir(folder: Path) -> None:
    """Create ``folder`` and its missing parents at 0700, each new one durable (its parent fsynced, or
    a power cut could take the folder and the files written into it); tighten it to 0700 if looser."""
    folder = Path(folder)
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    if not missing and not folder.is_dir():
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(folder))
    for new in reversed(missing):
        try:
            new.mkdir(mode=DIR_MODE)
        except FileExistsError:  # another process made it meanwhile
            pass
        fsync_dir(new.parent)
    if folder.stat().st_mode & 0o777 != DIR_MODE:
        os.chmod(folder, DIR_MODE)


def _write_tmp(path: Path, data: bytes) -> Path:
    """Write data to a new 0600 file beside path and fsync it; the caller renames or links it."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # a umask may have made it stricter; keep exactly 0600
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    return tmp


def write_private_file(path: Path, data: bytes) -> None:
    """Atomically replace path with data, at mode 0600 from the first byte."""
    path = Path(path)
    tmp = _write_tmp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def ensure_token_file(path: Path, nbytes: int = 32) -> bytes:
    """Return the token in path, first creating it (0600, url-safe text) if absent.

    Creation links a finished temp file into place, so concurrent callers agree on one token.
    """
    path = Path(path)
    try:
        if not path.exists():
            tmp = _write_tmp(path, secrets.token_urlsafe(nbytes).encode())
            try:
                os.link(tmp, path)
                fsync_dir(path.parent)
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        if path.stat().st_mode & 0o777 != FILE_MODE:
            os.chmod(path, FILE_MODE)
        return path.read_bytes().strip()
    except OSError as e:
        raise StarlingError(f"{path}: cannot create or read token file: {e.strerror}") from None
