"""Services a dead supervisord left behind: found through /proc (this home's, started by supervisord) and
stopped before `starling up` starts a new one, so their ports and names are free again."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

STOP_WITHIN_S = 10.0  # SIGTERM, then SIGKILL after this long


def _argv(pid: str) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _started_by_supervisord(pid: str) -> bool:
    """supervisord sets SUPERVISOR_ENABLED in every child's environment; systemd's units do not."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return b"SUPERVISOR_ENABLED=1" in f.read().split(b"\0")
    except OSError:
        return False


def find(home: Path) -> list[int]:
    """Pids of this home's services that supervisord started (call only while no supervisord runs for it)."""
    want = str(Path(home).resolve())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        argv = _argv(entry)
        if "-m" not in argv or "--home" not in argv:
            continue
        module, at = argv[argv.index("-m") + 1:][:1], argv[argv.index("--home") + 1:][:1]
        if not (module and at and module[0].startswith("services.")):
            continue
        try:
            same = str(Path(at[0]).resolve()) == want
        except OSError:
            continue
        if same and _started_by_supervisord(entry):
            found.append(int(entry))
    return found


def stop(pids: list[int], within: float = STOP_WITHIN_S) -> None:
    """SIGTERM each, SIGKILL those still running after ``within`` s; returns once all are gone (bounded)."""
    for sig, wait in ((signal.SIGTERM, within), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            pids = [p for p in pids if _running(p)]
            if not pids:
                return
            time.sleep(0.05)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
    except (OSError, IndexError):
        return False
