"""The writer and a disk that fails it: what an SQLite error tells the client (its error code), and the
reserve that lets Starling still speak about itself while the data disk is full.

- ``code_for``: apsw.FullError is ``disk_full``, an I/O error ``io_error``, a busy or locked database
  ``busy`` (common/errors.py WRITER_CONDITIONS: the writer's condition, which clients wait out and send
  again); anything else ``internal``.
- ``Reserve``: a ballast file (``data_dir/.reserve``, ``[writer] reserve_mb``) made at start. When a
  commit or a checkpoint meets a full disk the writer frees it and turns to what must go on while the
  disk is full: heartbeats, enlistments, outbox claims and reports, lease renewals and releases, and the
  operator's alert (``EnqueueOutbox(alert=True)``) are applied in the room it left; every other write (a new
  message, a runner's step) is answered ``disk_full`` without being tried, so that room lasts. Once
  twice the ballast is free again the ballast is made again and every write is taken.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import apsw

from schema import messages as m

BALLAST = ".reserve"
CHECK_EVERY_S = 1.0    # while the disk is full: how often free space is looked at
MIN_ROOM_BYTES = 4 * 1024 * 1024  # beyond the ballast, free space needed to take every write again
# Writes that go on while the disk is full: small, and what keeps deliveries and `status` honest
# (a reply sent is recorded as sent, not sent again when its lease runs out).
# A process (re)started meanwhile enlists under its name first (Enlist), so that it can deliver and report too.
ADMITTED = (m.Heartbeat, m.Ping, m.RenewLease, m.ClaimOutbox, m.OutboxSent, m.OutboxFailed, m.OutboxProgress,
            m.ReleaseOutbox, m.ReleaseTurn, m.Enlist)
CHUNK_BYTES = 1024 * 1024  # one write of the ballast where fallocate is not supported


def code_for(exc: BaseException) -> str:
    """The error code a failed write is answered with."""
    if isinstance(exc, apsw.FullError) or (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)):
        return "disk_full"
    if isinstance(exc, apsw.IOError) or (isinstance(exc, OSError) and exc.errno == errno.EIO):
        return "io_error"
    if isinstance(exc, (apsw.BusyError, apsw.LockedError)):
        return "busy"
    return "internal"


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


class Reserve:
    def __init__(self, data_dir: Path, size_mb: float, log) -> None:
        self.data_dir = data_dir
        self.path = data_dir / BALLAST
        self.size = int(size_mb * 1024 * 1024)
        self.log = log
        self.full = False  # the disk filled: only ADMITTED writes are applied
        self.since = 0.0   # when it filled (wall clock, for the operator)
        self.next_check = 0.0

    # ------------------------------------------------------------ the ballast

    def setup(self) -> None:
        """At start: make the ballast when it is missing or short (a warning when the disk has no room)."""
        if not self.size:
            self.path.unlink(missing_ok=True)
            return
        try:
            if self.path.stat().st_size == self.size:
                return
        except FileNotFoundError:
            pass
        if not self._make():
            self.log.warning("reserve_not_made", path=str(self.path), reserve_bytes=self.size,
                             free_bytes=self._free(), note="no room for the disk reserve; made once there is")

    def _make(self) -> bool:
        """Write the ballast with real blocks (allocated, not sparse); False when the disk has no room."""
        tmp = self.path.with_name(BALLAST + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                try:
                    os.posix_fallocate(fd, 0, self.size)
                except OSError as exc:
                    if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                        raise
                    chunk = os.urandom(CHUNK_BYTES)  # not zeros: a compressing file system would keep no room
                    for _ in range(self.size // len(chunk) + 1):
                        os.write(fd, chunk)
                    os.ftruncate(fd, self.size)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            return True
        except OSError:
            tmp.unlink(missing_ok=True)
            return False

    def _free(self) -> int:
        try:
            return free_bytes(self.data_dir)
        except OSError:
            return 0

    # ------------------------------------------------------------ full and back

    def disk_full(self, error: str) -> None:
        """A commit or checkpoint met a full disk: free the ballast and keep to ADMITTED writes."""
        if self.full:
            return
        self.full = True
        self.since = time.time()
        self.next_check = time.monotonic() + CHECK_EVERY_S
        freed = self.path.exists()
        self.path.unlink(missing_ok=True)
        self.log.error("disk_full", data_dir=str(self.data_dir), error=error, reserve_freed_bytes=self.size if freed else 0,
                       free_bytes=self._free(), note="new messages wait at their gateways until space is freed;"
                       " heartbeats, deliveries and alerts go on in the reserve")

    def admits(self, op: m.WriteOp) -> bool:
        if not self.full:
            return True
        return isinstance(op, ADMITTED) or (isinstance(op, m.EnqueueOutbox) and op.alert)

    def on_timer(self, now_mono: float) -> None:
        """While full: once there is room for the ballast and more, make it again and take every write."""
        if not self.full or now_mono < self.next_check:
            return
        self.next_check = now_mono + CHECK_EVERY_S
        free = self._free()
        if free < self.size + max(self.size, MIN_ROOM_BYTES):
            return
        if self.size and not self._make():
            return
        self.full = False
        self.log.info("disk_space_back", free_bytes=self._free(), full_for_s=round(time.time() - self.since, 1))

    def describe(self) -> str:
        """The writer's heartbeat detail while the disk is full."""
        return (f"the data disk is full ({self.data_dir}, {self._free() / 2**20:.1f} MB free, since"
                f" {time.strftime('%H:%M:%S', time.localtime(self.since))}): new messages wait at their gateways"
                " until space is freed")

    def refusal(self) -> str:
        return f"the data disk is full ({self.data_dir}); held until space is freed"
