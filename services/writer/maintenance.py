"""The writer's housekeeping: WAL checkpoints, online backups in steps, FTS rebuild, old answer keys.

Timed housekeeping (checkpoints after commits and on the timer, pruning) that meets a full disk, an I/O
error or a busy database is logged and tried again on the next timer, never fatal: a full disk is the
writer's condition to wait out (services/writer/disk.py), not a reason to crash-loop.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import apsw

from common import health
from common.db import check_backup_target
from common.stores import db_store, keys_store, recall_store

BACKUP_STEP_PAGES = 1024  # pages copied per loop turn: writes go on between steps
ANSWER_KEYS_KEEP_S = 24 * 3600
PRUNE_EVERY_S = 60.0
PRUNE_BATCH = 5000
RELOG_EVERY_S = 60.0  # a housekeeping failure that goes on is logged again this often
# What housekeeping waits out: the disk, not the database file (damage goes up to the writer's refusal).
PASSING = (apsw.FullError, apsw.IOError, apsw.BusyError, apsw.LockedError)


@dataclass
class BackupJob:
    """One online backup in progress: SQLite's backup API, stepped between group commits."""

    target: Path
    temp: Path
    dest: apsw.Connection
    backup: object
    started: float = field(default_factory=time.monotonic)
    pages: int = 0


class Maintenance:
    def __init__(self, conn: apsw.Connection, db_file: Path, checkpoint_interval_s: float, wal_truncate_mb: float,
                 log) -> None:
        self.conn = conn
        self.db_file = db_file
        self.interval = checkpoint_interval_s
        self.truncate_bytes = int(wal_truncate_mb * 1024 * 1024)
        # A PASSIVE checkpoint once a quarter of the bound was committed: with no reader in the way it
        # copies everything, and the next commit writes the WAL from its beginning again. Much more
        # often costs the writer: most pages a commit writes are the same few hundred index leaves
        # every time, and each checkpoint writes them again.
        self.passive_bytes = self.truncate_bytes // 4
        # The WAL is measured in frames, as SQLite counts them, not by its file's size: the file never
        # shrinks after a PASSIVE checkpoint, so its size says how large the WAL once was, not what it
        # holds now.
        page_bytes = db_store.page_size(conn)
        self.truncate_pages = max(1, self.truncate_bytes // page_bytes)
        self.passive_pages = max(1, self.passive_bytes // page_bytes)
        self.wal_pages = 0  # frames in the WAL after the last commit (the connection's wal_hook)
        self.checked_pages = 0  # frames it held at the last checkpoint; 0 once it started over
        self.backfilled = 0  # of those, the frames copied into the database (readers may hold some back)
        conn.set_wal_hook(self._on_wal)
        self.log = log
        self.next_checkpoint = time.monotonic() + self.interval
        self.next_prune = time.monotonic() + PRUNE_EVERY_S
        self.backup: BackupJob | None = None
        self.on_disk_full: Callable[[str], None] = lambda error: None  # the writer's Reserve.disk_full
        self.hold_pruning: Callable[[], bool] = lambda: False  # True while the disk is full: no deletes
        self._failing: dict[str, float] = {}  # what fails now -> when it was last logged

    def wal_bytes(self) -> int:
        return health.wal_bytes(self.db_file)

    def _on_wal(self, _conn: apsw.Connection, _name: str, pages: int) -> int:
        """SQLite's word after each commit: the frames the WAL holds now. Fewer than after the last
        commit: it started over from its beginning (everything before was checkpointed)."""
        if pages < self.wal_pages:
            self.checked_pages = self.backfilled = 0
        self.wal_pages = pages
        return apsw.SQLITE_OK

    def checkpoint(self, mode: str) -> tuple[int, int, int]:
        result = db_store.checkpoint(self.conn, mode)
        _busy, log_pages, done = result  # TRUNCATE: 0 and 0 (the file is empty); -1 when it could not run
        if log_pages >= 0:
            self.wal_pages = self.checked_pages = log_pages
            self.backfilled = max(done, 0)
        self.next_checkpoint = time.monotonic() + self.interval
        return result

    def after_commit(self) -> None:
        """A checkpoint once the WAL gained a quarter of its bound in frames since the last one: PASSIVE,
        or TRUNCATE when it holds more than its bound (readers kept it from starting over; TRUNCATE waits
        for them, up to the busy timeout, so it is tried no more often than that either)."""
        pages = self.wal_pages
        if pages - self.checked_pages < self.passive_pages:
            return
        if pages < self.truncate_pages:
            self._passing("checkpoint", self.checkpoint, "PASSIVE")
            return
        self.checked_pages = pages  # also when it fails
        done = self._passing("checkpoint", self.checkpoint, "TRUNCATE")
        if done is not None:
            busy, log_pages, checkpointed = done
            self.log.info("wal_truncated", wal_bytes=self.wal_bytes(), frames=pages, busy=busy,
                          wal_pages=log_pages, checkpointed=checkpointed)

    def on_timer(self, now: float) -> None:
        if now >= self.next_checkpoint:
            self.next_checkpoint = now + self.interval  # also when it fails: tried again next interval
            if self.wal_pages > self.backfilled:  # frames not in the database yet
                self._passing("checkpoint", self.checkpoint, "PASSIVE")
        if now >= self.next_prune:
            self.next_prune = now + PRUNE_EVERY_S
            if not self.hold_pruning():
                self._passing("prune", self._prune)

    def _prune(self) -> None:
        db_store.begin(self.conn)
        try:
            removed = keys_store.prune_answers(self.conn, time.time() - ANSWER_KEYS_KEEP_S, PRUNE_BATCH)
            db_store.commit(self.conn)
        except BaseException:
            db_store.rollback(self.conn)
            raise
        if removed:
            self.log.info("answer_keys_pruned", removed=removed)

    def _passing(self, what: str, work, *args):
        """``work(*args)``, or None when it met a full disk, an I/O error or a busy database (logged,
        at most every RELOG_EVERY_S while it goes on; a full disk is told to the reserve)."""
        try:
            result = work(*args)
        except PASSING as exc:
            if isinstance(exc, apsw.FullError):
                self.on_disk_full(str(exc))
            now = time.monotonic()
            if now - self._failing.get(what, -RELOG_EVERY_S) >= RELOG_EVERY_S:
                self._failing[what] = now
                self.log.warning(f"{what}_failed", error=f"{type(exc).__name__}: {exc}",
                                 note="tried again on the next timer")
            return None
        if self._failing.pop(what, None) is not None:
            self.log.info(f"{what}_recovered")
        return result

    def next_due(self) -> float:
        return min(self.next_checkpoint, self.next_prune)

    def start_backup(self, target: Path) -> BackupJob:
        if self.backup is not None:
            return self.backup
        target = target.expanduser().absolute()
        check_backup_target(target, self.db_file)
        target.parent.mkdir(parents=True, exist_ok=True)
        temp = target.with_name(f".{target.name}.partial")
        temp.unlink(missing_ok=True)
        fd = os.open(temp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        os.close(fd)
        dest = apsw.Connection(str(temp))
        self.backup = BackupJob(target, temp, dest, dest.backup("main", self.conn, "main"))
        return self.backup

    def step_backup(self) -> BackupJob | None:
        """Copy one step; return the job when it is finished (file in place), else None."""
        job = self.backup
        if job is None:
            return None
        job.backup.step(BACKUP_STEP_PAGES)
        job.pages = job.backup.pagecount
        if not job.backup.done:
            return None
        job.backup.finish()
        job.dest.close()
        os.replace(job.temp, job.target)
        dir_fd = os.open(job.target.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self.backup = None
        return job

    def abort_backup(self) -> None:
        job = self.backup
        if job is None:
            return
        try:
            job.backup.finish()
        except apsw.Error:
            pass
        job.dest.close()
        job.temp.unlink(missing_ok=True)
        self.backup = None

    def rebuild_fts(self) -> None:
        db_store.begin(self.conn)
        try:
            recall_store.rebuild(self.conn)
        except BaseException:
            db_store.rollback(self.conn)
            raise
        db_store.commit(self.conn)

    def backfill_fts(self) -> bool:
        """At open: rebuild the recall index when it holds fewer documents than there are turns."""
        if not recall_store.needs_backfill(self.conn):
            return False
        self.rebuild_fts()
        return True
