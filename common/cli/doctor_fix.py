"""`starling doctor --fix`: the repairs that are always safe, each reported: private modes (folders 0700,
secret files 0600, config.toml not open to others, agent packs 0700/0600), missing state folders and
private workspaces, and a missing default agent pack. Nothing is ever deleted or overwritten."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from common import personas
from common.config import load_config
from common.errors import ConfigError, StarlingError
from common.home import DIR_MODE, FILE_MODE, Paths, make_private_dir, paths_for

DEFAULT_AGENT = "default"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _tighten(path: Path, wanted: int, changed: list[str]) -> None:
    """chmod ``path`` to ``wanted`` when it grants more than that (a stricter mode is left alone)."""
    try:
        mode = _mode(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(path.lstat().st_mode) or not mode & ~wanted & 0o777:
        return
    os.chmod(path, mode & wanted)
    changed.append(f"chmod {mode & wanted:04o} {path} (was {mode:04o})")


def fix_folders(paths: Paths, changed: list[str]) -> None:
    """Every folder of the layout exists at 0700 (what `starling up` would also make)."""
    for folder in paths.layout():
        if not folder.exists():
            make_private_dir(folder)
            changed.append(f"created folder {folder} (0700)")
        else:
            _tighten(folder, DIR_MODE, changed)


def fix_files(paths: Paths, changed: list[str]) -> None:
    """Secret files and the database 0600; config.toml keeps its group bits, loses others'."""
    db_files = [paths.db_file, *(paths.db_file.with_name(paths.db_file.name + s) for s in ("-wal", "-shm"))]
    for file in (paths.secrets_file, paths.control_token_file, paths.session_secret_file, *db_files):
        _tighten(file, FILE_MODE, changed)
    _tighten(paths.config_file, 0o770, changed)


def fix_agents(paths: Paths, changed: list[str]) -> None:
    """The default agent's pack when there is none; each pack 0700/0600; each agent's private workspace."""
    if not (paths.agents_dir / DEFAULT_AGENT).exists():
        personas.create_pack(paths, DEFAULT_AGENT)
        changed.append(f"created agent {DEFAULT_AGENT!r} at {paths.agents_dir / DEFAULT_AGENT} (the default pack)")
    for pack in personas.list_packs(paths):
        for folder, dirs, files in os.walk(pack.path):
            _tighten(Path(folder), DIR_MODE, changed)
            for name in files:
                _tighten(Path(folder) / name, FILE_MODE, changed)
        for folder in (paths.private_workspace(pack.id), paths.private_workspace(pack.id) / personas.SCRATCHPAD):
            if not folder.exists():
                make_private_dir(folder)
                changed.append(f"created folder {folder} (0700: agent {pack.id!r}'s private workspace)")


def fix(home: Path) -> list[str]:
    """Repair what is safe to repair in this home; one line per change. A config that does not load stops
    here (the folders it names are unknown): the checks that follow say why."""
    try:
        cfg = load_config(home / "config.toml")
    except ConfigError:
        return []
    paths = paths_for(home, cfg)
    changed: list[str] = []
    try:
        fix_folders(paths, changed)
        fix_files(paths, changed)
        fix_agents(paths, changed)
    except OSError as exc:
        raise StarlingError(f"doctor --fix stopped: {exc.filename}: {exc.strerror}"
                            + (f" (done before: {'; '.join(changed)})" if changed else "")) from None
    return changed
