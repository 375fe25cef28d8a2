"""The Starling homes running on this host, for a command run where there is no home: one run file per
running home, written by `starling up` once supervisord answers and removed by `starling down`, in
$XDG_RUNTIME_DIR/starling/ (else /tmp/starling-<uid>/), a 0700 folder of this user's. A file whose
supervisord is gone (a reboot, kill -9) is skipped and removed when listed."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from common.home import make_private_dir, write_private_file


@dataclass(frozen=True)
class Running:
    home: str
    pid: int  # supervisord's
    control: str  # [control] listen
    started: float
    data: str = ""  # its data_dir when it started (supervisord's socket is there)


def folder() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "starling"
    return Path("/tmp") / f"starling-{os.getuid()}"


def _usable(path: Path) -> bool:
    """Ours and private: a folder another user made in /tmp is never read or written."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    return path.is_dir() and not path.is_symlink() and st.st_uid == os.getuid() and st.st_mode & 0o077 == 0


def _file(home: Path) -> Path:
    return folder() / (hashlib.sha256(str(home).encode()).hexdigest()[:16] + ".json")


def record(home: Path, pid: int, control: str, data: Path) -> None:
    """`starling up`: this home runs under supervisord ``pid``. Best effort: a home runs without it."""
    try:
        make_private_dir(folder())
        if _usable(folder()):
            entry = {"home": str(home), "pid": pid, "control": control, "started": time.time(), "data": str(data)}
            write_private_file(_file(home), json.dumps(entry).encode())
    except OSError:
        pass


def remove(home: Path) -> None:
    try:
        _file(home).unlink(missing_ok=True)
    except OSError:
        pass


def _is_supervisord(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"supervisord" in f.read()
    except OSError:
        return False


def running() -> list[Running]:
    """The homes whose supervisord still runs, oldest first; stale files are removed."""
    where = folder()
    if not _usable(where):
        return []
    found = []
    for path in sorted(where.glob("*.json")):
        try:
            raw = json.loads(path.read_text())
            entry = Running(str(raw["home"]), int(raw["pid"]), str(raw.get("control", "")), float(raw["started"]),
                            str(raw.get("data", "")))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _is_supervisord(entry.pid):
            found.append(entry)
        else:
            path.unlink(missing_ok=True)
    return sorted(found, key=lambda e: e.started)


def entry_for(home: Path) -> Running | None:
    return next((e for e in running() if e.home == str(home)), None)


def listing() -> str:
    """Lines naming the running homes, for an error message; "" when none runs."""
    homes = running()
    if not homes:
        return ""
    lines = [f"  {e.home}  (supervisord pid {e.pid}, control {e.control})" for e in homes]
    return "Starling homes running on this host:\n" + "\n".join(lines)
