"""Opening the database: the writer's one read-write connection, and read-only ones for everyone else."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Iterator

import apsw

from common.errors import DatabaseUnusable, SchemaNotReady, SchemaTooNew
from common.log import get_logger
from common.stores import db_store, schema_store

BUSY_TIMEOUT_MS = 5000
REFUSAL_FILE = "writer.refused"  # in data/run/: why the writer would not start on the database


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


def unusable(db_file: Path | str, exc: apsw.Error) -> DatabaseUnusable:
    """The error that names a file SQLite cannot read as a database, and the way out."""
    if isinstance(exc, apsw.NotADBError):
        return DatabaseUnusable(db_file, f"not a SQLite database ({exc})")
    return DatabaseUnusable(db_file, f"damaged ({exc})")


UNUSABLE_ERRORS = (apsw.NotADBError, apsw.CorruptError)


def check_database(conn: apsw.Connection, db_file: Path | str, seconds: float | None = None) -> bool:
    """quick_check within ``seconds`` (None: no bound): True when it ran to the end, False when cut
    short. Raises DatabaseUnusable for a file that is damaged or not a database."""
    try:
        problems = db_store.quick_check_within(conn, seconds)
    except UNUSABLE_ERRORS as exc:
        raise unusable(db_file, exc) from None
    if problems is None:
        return False
    if problems != ["ok"]:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        first = " ".join(problems[0].split())  # SQLite's rows may hold newlines: the refusal is one line
        raise DatabaseUnusable(db_file, f"damaged (quick_check: {first}{more})")
    return True


def refusal_file(db_file: Path) -> Path:
    """Where the writer says why it refused ``db_file`` (removed once it opens it)."""
    return db_file.parent / "run" / REFUSAL_FILE


def refusal(db_file: Path) -> str | None:
    """Why the writer refused the database at its last start, or None when it did not."""
    try:
        return refusal_file(db_file).read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def wait_for_schema(db_file: Path, timeout_s: float = 30.0, poll_s: float = 0.05, stop=None) -> apsw.Connection:
    """Wait until the writer has migrated the database to this code's version; return a reader.

    A database newer than the code is refused at once (SchemaTooNew). A file the writer refused, or
    that is damaged or not a database, is waited out (the operator may restore it), and the reason
    is logged once, and named when the wait ends. ``stop`` (a threading.Event) ends the wait early,
    for a service told to stop meanwhile.
    """
    expected = schema_store.code_version()
    deadline = time.monotonic() + timeout_s
    told = ""
    while True:
        state = _schema_state(db_file, expected)
        if isinstance(state, apsw.Connection):
            return state
        last, unusual = state
        if unusual and last != told:  # a file that will not do: said once, not at every poll
            get_logger().warning("schema_wait", db=str(db_file), reason=last)
            told = last
        if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
            raise SchemaNotReady(db_file, f"{last} after {timeout_s:g}s; is the writer running?")
        time.sleep(poll_s)


def _schema_state(db_file: Path, expected: int) -> apsw.Connection | tuple[str, bool]:
    """A reader at the expected version, or (why not yet, whether that is more than the writer not
    having got there yet)."""
    if not db_file.exists():
        return "the database does not exist yet", False
    refused = refusal(db_file)
    if refused:
        return f"the writer refused the database: {refused}", True
    conn = open_reader(db_file)
    try:
        current = schema_store.check_not_newer(conn, db_file)
    except SchemaTooNew:
        conn.close()
        raise
    except UNUSABLE_ERRORS as exc:
        conn.close()
        return str(unusable(db_file, exc)), True
    if current == expected:
        return conn
    conn.close()
    return f"schema version {current}, waiting for {expected}", False


def check_backup_target(target: Path, db_file: Path) -> None:
    """Refuse a backup path that would replace the live database, its WAL or shared memory, or land
    among the bus sockets: writes acked after such a "backup" would go to an unlinked file."""
    resolved = target.resolve()
    live = [db_file.resolve(), *(db_file.with_name(db_file.name + s).resolve() for s in ("-wal", "-shm", "-journal"))]
    if resolved in live or (resolved.exists() and any(p.exists() and os.path.samefile(resolved, p) for p in live)):
        raise ValueError(f"{target} is the live database (or its WAL); choose another backup path")
    if db_file.parent.joinpath("run").resolve() in resolved.parents:
        raise ValueError(f"{target} is inside the bus socket folder; choose another backup path")
