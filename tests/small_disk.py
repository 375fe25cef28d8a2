"""A real full filesystem for tests: a small tmpfs mounted as a home's data_dir (tests run as root), with
the services' log files on a tmpfs of their own (as under supervisord, whose pipe a full data disk does
not break), filled with a file until the kernel says ENOSPC and freed by deleting it. Every mount is
undone at the end, whatever happens; a test that cannot mount is skipped, not failed."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

FILL = "fill.bin"
LOGS_MB = 64


def _mount(target: Path, size_mb: int) -> None:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", str(target)],
                   check=True, capture_output=True, timeout=10)


def _umount(target: Path) -> None:
    for _ in range(20):
        done = subprocess.run(["umount", str(target)], capture_output=True, timeout=10)
        if done.returncode == 0 or b"not mounted" in done.stderr:
            return
        subprocess.run(["sleep", "0.2"], timeout=5)
    subprocess.run(["umount", "-l", str(target)], capture_output=True, timeout=10)


@contextlib.contextmanager
def small_disk(size_mb: int):
    """A fresh home root under /tmp whose data/ is a ``size_mb`` tmpfs (data/logs another one)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    root = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    data, logs = root / "data", root / "data" / "logs"
    mounted: list[Path] = []
    try:
        try:
            _mount(data, size_mb)
            mounted.append(data)
            _mount(logs, LOGS_MB)
            mounted.append(logs)
        except (subprocess.CalledProcessError, FileNotFoundError) as exc:
            pytest.skip(f"cannot mount a tmpfs here: {exc}")
        yield root
    finally:
        for target in reversed(mounted):
            _umount(target)
        shutil.rmtree(root, ignore_errors=True)


def fill(data_dir: Path) -> int:
    """Write a file until the disk has no room left; returns its size."""
    path = data_dir / FILL
    written = 0
    with open(path, "ab", buffering=0) as f:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9):
            block = b"\0" * chunk
            while True:
                try:
                    n = f.write(block)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                written += n
                if n < chunk:
                    break
    return written


def free(data_dir: Path) -> None:
    (data_dir / FILL).unlink(missing_ok=True)


def free_bytes(data_dir: Path) -> int:
    st = os.statvfs(data_dir)
    return st.f_bavail * st.f_frsize
