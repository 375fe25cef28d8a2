"""Migrations and opening the database: versions, every table, refusing newer schemas, read-only readers."""

from __future__ import annotations

import time
from pathlib import Path

import apsw
import pytest

from common import db
from common.errors import SchemaNotReady, SchemaTooNew
from common.stores import schema_store, session_store

# Every table DESIGN.md "SQLite" lists, under the names 0001_init.sql gives them, plus the ones the
# rule of durability needs (write_keys, service_beats) and the recall index.
DESIGN_TABLES = {
    "sessions",
    "turns",
    "session_map",  # sender -> session map
    "inbound_keys",  # inbound dedupe keys
    "write_keys",  # idempotency answers
    "outbox",
    "tool_executions",
    "approvals",
    "grants",  # standing grants
    "sender_access",
    "pairing_codes",
    "jobs",  # background jobs
    "cron_jobs",
    "cron_runs",
    "skill_drafts",
    "usage",  # usage and cost
    "audit",
    "daemon_log",
    "dashboard_accounts",
    "service_beats",
    "turns_fts",  # recall
}


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    return tmp_path / "starling.db"


@pytest.fixture
def conn(db_file: Path) -> apsw.Connection:
    """A writer connection on a new, empty file (not migrated)."""
    c = db.open_writer(db_file)
    yield c
    c.close()


def test_migrations_are_numbered_from_one_without_gaps():
    numbers = [number for number, _, _ in schema_store.migrations()]
    assert list(range(1, len(numbers) + 1)) == numbers


def test_code_version_is_the_last_migration_number():
    assert schema_store.migrations()[-1][0] == schema_store.code_version()


def test_a_new_database_is_at_version_zero(conn):
    assert 0 == schema_store.version(conn)


def test_migrate_from_empty_reaches_the_code_version(conn, db_file):
    assert (0, schema_store.code_version()) == schema_store.migrate(conn, db_file)


def test_migrate_records_the_code_version(conn, db_file):
    schema_store.migrate(conn, db_file)
    assert schema_store.code_version() == schema_store.version(conn)


def test_migrate_creates_every_table_the_design_lists(conn, db_file):
    schema_store.migrate(conn, db_file)
    assert set() == DESIGN_TABLES - set(schema_store.table_names(conn))


def test_migrate_reports_each_migration_it_applies(conn, db_file):
    seen = []
    schema_store.migrate(conn, db_file, progress=lambda number, name: seen.append(number))
    assert [number for number, _, _ in schema_store.migrations()] == seen


def test_migrate_again_is_a_no_op(conn, db_file):
    schema_store.migrate(conn, db_file)
    v = schema_store.code_version()
    assert (v, v) == schema_store.migrate(conn, db_file)


def test_migrate_again_applies_nothing(conn, db_file):
    schema_store.migrate(conn, db_file)
    seen = []
    schema_store.migrate(conn, db_file, progress=lambda number, name: seen.append(number))
    assert [] == seen


def test_migrate_again_keeps_the_data(conn, db_file):
    schema_store.migrate(conn, db_file)
    session_store.open_session(conn, "main", "tg", "c1", 1.0)
    schema_store.migrate(conn, db_file)
    assert 1 == session_store.count(conn)


def test_a_failing_migration_leaves_no_trace(conn, db_file, monkeypatch):
    number, name, sql = schema_store.migrations()[0]
    broken = [(number, name, sql + "\nthis is not valid;\n")]
    monkeypatch.setattr(schema_store, "migrations", lambda: broken)
    with pytest.raises(apsw.SQLError):
        schema_store.migrate(conn, db_file)
    assert (0, [], False) == (schema_store.version(conn), schema_store.table_names(conn), conn.in_transaction)


def test_force_version_sets_the_recorded_version(conn):
    schema_store.force_version(conn, 7)
    assert 7 == schema_store.version(conn)


def test_table_names_of_an_empty_database_is_empty(conn):
    assert [] == schema_store.table_names(conn)


def test_check_not_newer_returns_the_current_version(conn, db_file):
    schema_store.migrate(conn, db_file)
    assert schema_store.code_version() == schema_store.check_not_newer(conn, db_file)


def test_migrate_refuses_a_newer_database(conn, db_file):
    schema_store.force_version(conn, schema_store.code_version() + 1)
    with pytest.raises(SchemaTooNew):
        schema_store.migrate(conn, db_file)


def test_schema_too_new_names_both_versions(conn, db_file):
    newer = schema_store.code_version() + 1
    schema_store.force_version(conn, newer)
    with pytest.raises(SchemaTooNew) as info:
        schema_store.check_not_newer(conn, db_file)
    assert (newer, schema_store.code_version()) == (info.value.found, info.value.known)


def test_wait_for_schema_refuses_a_newer_database_at_once(conn, db_file):
    schema_store.migrate(conn, db_file)
    schema_store.force_version(conn, schema_store.code_version() + 1)
    started = time.monotonic()
    with pytest.raises(SchemaTooNew):
        db.wait_for_schema(db_file, timeout_s=5.0)
    assert time.monotonic() - started < 1.0


def test_wait_for_schema_returns_a_reader_at_the_code_version(conn, db_file):
    schema_store.migrate(conn, db_file)
    reader = db.wait_for_schema(db_file, timeout_s=0.2)
    try:
        found = schema_store.version(reader)
    finally:
        reader.close()
    assert schema_store.code_version() == found


def test_wait_for_schema_raises_not_ready_on_a_missing_file(tmp_path):
    started = time.monotonic()
    with pytest.raises(SchemaNotReady):
        db.wait_for_schema(tmp_path / "missing.db", timeout_s=0.2)
    assert time.monotonic() - started < 2.0


def test_wait_for_schema_raises_not_ready_on_an_unmigrated_file(conn, db_file):
    with pytest.raises(SchemaNotReady):
        db.wait_for_schema(db_file, timeout_s=0.2)


def test_open_reader_of_a_missing_file_raises_not_ready(tmp_path):
    with pytest.raises(SchemaNotReady):
        db.open_reader(tmp_path / "missing.db")


def test_open_reader_does_not_create_the_file(tmp_path):
    path = tmp_path / "missing.db"
    with pytest.raises(SchemaNotReady):
        db.open_reader(path)
    assert not path.exists()


def test_a_reader_cannot_write(conn, db_file):
    schema_store.migrate(conn, db_file)
    reader = db.open_reader(db_file)
    try:
        with pytest.raises(apsw.ReadOnlyError):
            session_store.open_session(reader, "main", "tg", "c1", 1.0)
    finally:
        reader.close()


def test_a_reader_cannot_migrate(tmp_path):
    path = tmp_path / "starling.db"
    db.open_writer(path).close()
    reader = db.open_reader(path)
    try:
        with pytest.raises(apsw.ReadOnlyError):
            schema_store.migrate(reader, path)
    finally:
        reader.close()


def test_open_writer_makes_the_file_private(conn, db_file):
    assert 0o600 == db_file.stat().st_mode & 0o777
