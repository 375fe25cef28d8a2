"""Schema version and the forward-only migrations in schema/migrations/."""

from __future__ import annotations

import re
from pathlib import Path

import apsw

from common.errors import SchemaTooNew

USER_VERSION = "PRAGMA user_version"
SET_USER_VERSION = "PRAGMA user_version = {version:d}"
BEGIN = "BEGIN IMMEDIATE"
COMMIT = "COMMIT"
ROLLBACK = "ROLLBACK"
TABLE_NAMES = "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    """(number, file name, SQL) of every migration, in order; numbers are 1, 2, 3, ... without gaps."""
    import schema  # its folder read with pathlib: importlib.resources costs every process ~1 MB of imports

    folder = Path(schema.__file__).parent / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    for expected, (number, name, _) in enumerate(found, start=1):
        if number != expected:
            raise RuntimeError(f"schema/migrations: {name} breaks the sequence (expected {expected:04d}_*)")
    return found


def code_version() -> int:
    """The schema version this code expects: the number of the last migration."""
    return len(migrations())


def version(conn: apsw.Connection) -> int:
    return int(conn.execute(USER_VERSION).fetchall()[0][0])


def force_version(conn: apsw.Connection, number: int) -> None:
    """Set the recorded schema version without migrating: it exists for tests and recovery only."""
    conn.execute(SET_USER_VERSION.format(version=number))


def table_names(conn: apsw.Connection) -> list[str]:
    """Every table in the database (virtual and FTS shadow tables included), sorted by name."""
    return [row[0] for row in conn.execute(TABLE_NAMES)]


def check_not_newer(conn: apsw.Connection, db_file: Path | str) -> int:
    current, known = version(conn), code_version()
    if current > known:
        raise SchemaTooNew(db_file, current, known)
    return current


def migrate(conn: apsw.Connection, db_file: Path | str, progress=None) -> tuple[int, int]:
    """Apply what is missing, each migration and its version record in one transaction.

    Returns (version before, version after). A database newer than the code is refused.
    """
    before = check_not_newer(conn, db_file)
    for number, name, sql in migrations():
        if number <= before:
            continue
        if progress:
            progress(number, name)
        conn.execute(BEGIN)
        try:
            conn.execute(sql)
            conn.execute(SET_USER_VERSION.format(version=number))
        except BaseException:
            conn.execute(ROLLBACK)
            raise
        conn.execute(COMMIT)
    return before, version(conn)
