"""Opening the database: the writer's one read-write connection, and read-only ones for everyone else."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

import apsw

from common.errors import SchemaNotReady
from common.stores import db_store, schema_store

BUSY_TIMEOUT_MS = 5000


def open_writer(db_file: Path, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> apsw.Connection:
    """The sole read-write connection (only the writer service calls this)."""
    db_file.parent.mkdir(parents=True, exist_ok=True)
    conn = apsw.Connection(
        str(db_file), flags=apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE | apsw.SQLITE_OPEN_NOMUTEX
    )
    db_store.configure_writer(conn, busy_timeout_ms)
    db_file.chmod(0o600)
    return conn


def open_reader(db_file: Path, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> apsw.Connection:
    """A read-only connection (``mode=ro``); it cannot write even by mistake."""
    if not db_file.exists():
        raise SchemaNotReady(db_file, "the database does not exist yet; is the writer running?")
    conn = apsw.Connection(
        f"file:{db_file}?mode=ro",
        flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI | apsw.SQLITE_OPEN_NOMUTEX,
    )
    db_store.configure_reader(conn, busy_timeout_ms)
    return conn


@contextlib.contextmanager
def read_tx(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """A short read transaction: one consistent snapshot, released at once (long readers starve checkpoints)."""
    db_store.begin_read(conn)
    try:
        yield conn
    finally:
        db_store.rollback(conn)


def wait_for_schema(db_file: Path, timeout_s: float = 30.0, poll_s: float = 0.05, stop=None) -> apsw.Connection:
    """Wait until the writer has migrated the database to this code's version; return a reader.

    A database newer than the code is refused at once (SchemaTooNew). ``stop`` (a threading.Event)
    ends the wait early, for a service told to stop meanwhile.
    """
    expected = schema_store.code_version()
    deadline = time.monotonic() + timeout_s
    last = "the database does not exist yet"
    while True:
        if db_file.exists():
            conn = open_reader(db_file)
            current = schema_store.check_not_newer(conn, db_file)
            if current == expected:
                return conn
            conn.close()
            last = f"schema version {current}, waiting for {expected}"
        if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
            raise SchemaNotReady(db_file, f"{last} after {timeout_s:g}s; is the writer running?")
        time.sleep(poll_s)


def check_backup_target(target: Path, db_file: Path) -> None:
    """Refuse a backup path that would replace the live database, its WAL or shared memory, or land
    among the bus sockets: writes acked after such a "backup" would go to an unlinked file."""
    resolved = target.resolve()
    live = [db_file.resolve(), *(db_file.with_name(db_file.name + s).resolve() for s in ("-wal", "-shm", "-journal"))]
    if resolved in live or (resolved.exists() and any(p.exists() and os.path.samefile(resolved, p) for p in live)):
        raise ValueError(f"{target} is the live database (or its WAL); choose another backup path")
    if db_file.parent.joinpath("run").resolve() in resolved.parents:
        raise ValueError(f"{target} is inside the bus socket folder; choose another backup path")
