"""Connection-level SQL: pragmas, transactions, checkpoints, integrity and size of the database."""

from __future__ import annotations

import time

import apsw

WRITER_PRAGMAS = (
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = FULL",
    "PRAGMA foreign_keys = ON",
    # the writer checkpoints on its own timer, never inside a commit
    "PRAGMA wal_autocheckpoint = 0",
    "PRAGMA temp_store = MEMORY",
)
READER_PRAGMAS = ("PRAGMA query_only = ON", "PRAGMA foreign_keys = ON")

BEGIN = "BEGIN IMMEDIATE"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
SAVEPOINT = "SAVEPOINT req"
RELEASE = "RELEASE req"
ROLLBACK_TO = "ROLLBACK TO req"
BEGIN_READ = "BEGIN DEFERRED"
CHECKPOINT = "PRAGMA wal_checkpoint({mode})"
CHECKPOINT_MODES = ("PASSIVE", "FULL", "RESTART", "TRUNCATE")
INTEGRITY_CHECK = "PRAGMA integrity_check"
QUICK_CHECK = "PRAGMA quick_check"
JOURNAL_MODE = "PRAGMA journal_mode"
SYNCHRONOUS = "PRAGMA synchronous"
FOREIGN_KEYS = "PRAGMA foreign_keys"
PAGE_COUNT = "PRAGMA page_count"
PAGE_SIZE = "PRAGMA page_size"


def configure_writer(conn: apsw.Connection, busy_timeout_ms: int) -> None:
    conn.set_busy_timeout(busy_timeout_ms)
    for pragma in WRITER_PRAGMAS:
        conn.execute(pragma).fetchall()


def configure_reader(conn: apsw.Connection, busy_timeout_ms: int) -> None:
    conn.set_busy_timeout(busy_timeout_ms)
    for pragma in READER_PRAGMAS:
        conn.execute(pragma).fetchall()


def settings(conn: apsw.Connection) -> dict[str, object]:
    """What the connection runs with, for tests and `doctor`."""
    return {
        "journal_mode": conn.execute(JOURNAL_MODE).fetchall()[0][0],
        "synchronous": conn.execute(SYNCHRONOUS).fetchall()[0][0],
        "foreign_keys": conn.execute(FOREIGN_KEYS).fetchall()[0][0],
    }


def begin(conn: apsw.Connection) -> None:
    conn.execute(BEGIN)


def commit(conn: apsw.Connection) -> None:
    conn.execute(COMMIT)


def rollback(conn: apsw.Connection) -> None:
    if not conn.in_transaction:
        return
    conn.execute(ROLLBACK)


def savepoint(conn: apsw.Connection) -> None:
    conn.execute(SAVEPOINT)


def release(conn: apsw.Connection) -> None:
    conn.execute(RELEASE)


def rollback_to(conn: apsw.Connection) -> None:
    """Undo one request inside a group commit, keeping the rest of the batch."""
    conn.execute(ROLLBACK_TO)
    conn.execute(RELEASE)


def begin_read(conn: apsw.Connection) -> None:
    conn.execute(BEGIN_READ)


def checkpoint(conn: apsw.Connection, mode: str) -> tuple[int, int, int]:
    """(busy, wal pages, pages checkpointed), as PRAGMA wal_checkpoint reports them."""
    mode = mode.upper()
    if mode not in CHECKPOINT_MODES:
        raise ValueError(f"checkpoint mode must be one of {', '.join(CHECKPOINT_MODES)}, not {mode!r}")
    busy, log, done = conn.execute(CHECKPOINT.format(mode=mode)).fetchall()[0]
    return int(busy), int(log), int(done)


def integrity_check(conn: apsw.Connection, quick: bool = False) -> list[str]:
    """["ok"] when the file is sound, else SQLite's list of problems."""
    return [row[0] for row in conn.execute(QUICK_CHECK if quick else INTEGRITY_CHECK)]


def quick_check_within(conn: apsw.Connection, seconds: float | None) -> list[str] | None:
    """quick_check, given at most ``seconds`` (None: no bound); None when it was cut short."""
    if seconds is None:
        return integrity_check(conn, quick=True)
    deadline = time.monotonic() + seconds
    conn.set_progress_handler(lambda: time.monotonic() >= deadline, 10_000)  # a true return interrupts
    try:
        return integrity_check(conn, quick=True)
    except apsw.InterruptError:
        return None
    finally:
        conn.set_progress_handler(None)


def page_size(conn: apsw.Connection) -> int:
    return int(conn.execute(PAGE_SIZE).fetchall()[0][0])


def size_bytes(conn: apsw.Connection) -> int:
    pages = conn.execute(PAGE_COUNT).fetchall()[0][0]
    return int(pages) * int(conn.execute(PAGE_SIZE).fetchall()[0][0])
