"""A person editing an agent's persona file (the dashboard's Agents page): under the memory tools' lock
(agents/<id>/.memory.lock), the file as it was copied first to data/backups/agents/<id>/ (common/skills.py's
backup: <YYYY-MM-DD-HHMMSS>-<FILE>), then replaced atomically (0600). An agent's config.toml must load."""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from common.config import ID_PATTERN
from common.errors import ConfigError, InvalidInput
from common.home import FILE_MODE, Paths, write_private_file
from common.personas import load_settings
from common.skills import backup

EDITABLE = ("IDENTITY.md", "SOUL.md", "USER.md", "AGENTS.md", "MEMORY.md", "config.toml")
MAX_BYTES = {"MEMORY.md": 64 * 1024, "USER.md": 64 * 1024}  # the memory tools' limits; others below
DEFAULT_MAX = 256 * 1024
_ID = re.compile(ID_PATTERN)


def pack_of(paths: Paths, agent: str) -> Path:
    if not _ID.match(agent or "") or not (paths.agents_dir / agent).is_dir():
        raise InvalidInput(f"no agent {agent!r} (see `starling agent list`)")
    return paths.agents_dir / agent


@contextmanager
def locked(pack: Path) -> Iterator[None]:
    fd = os.open(pack / ".memory.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check(pack: Path, name: str, text: str) -> bytes:
    """The file's new bytes, or InvalidInput saying why not (a config.toml that does not load, in its words)."""
    if name not in EDITABLE:
        raise InvalidInput(f"{name!r} is not a persona file that can be edited here ({', '.join(EDITABLE)})")
    data = text.replace("\r\n", "\n").encode("utf-8")
    limit = MAX_BYTES.get(name, DEFAULT_MAX)
    if len(data) > limit:
        raise InvalidInput(f"{name} would be {len(data)} bytes, over its {limit // 1024} KB limit")
    if name == "config.toml":
        with tempfile.TemporaryDirectory() as scratch:
            (Path(scratch) / "config.toml").write_bytes(data)
            try:
                load_settings(Path(scratch))
            except ConfigError as exc:
                raise InvalidInput(str(exc).replace(str(Path(scratch) / "config.toml"), str(pack / name))) from None
    return data


def save(paths: Paths, agent: str, name: str, text: str) -> Path | None:
    """Back the file up, then replace it; the backup's path (None when the file did not exist)."""
    pack = pack_of(paths, agent)
    data = check(pack, name, text)
    path = pack / name
    with locked(pack):
        copy = backup(paths, agent, path, name) if path.is_file() else None
        write_private_file(path, data)
    return copy
