"""The writer at boot: it refuses a database newer than its code, and backfills the recall index."""

from __future__ import annotations

import time

from common import db
from common.stores import recall_store, schema_store, session_store, turn_store
from tests.procs import Proc, start_writer


def test_a_database_newer_than_the_code_is_refused_with_a_clear_message(home):
    conn = db.open_writer(home.paths.db_file)
    schema_store.migrate(conn, home.paths.db_file)
    schema_store.force_version(conn, schema_store.code_version() + 1)
    conn.close()
    proc = Proc(home, "writer")
    code = proc.popen.wait(20)
    proc.stop()
    text = proc.log_text()
    assert (78, True, True) == (code, "is newer than this Starling knows" in text, str(home.paths.db_file) in text)


def test_the_writer_backfills_a_recall_index_that_misses_turns(home):
    conn = db.open_writer(home.paths.db_file)
    schema_store.migrate(conn, home.paths.db_file)
    session = session_store.open_session(conn, "default", "test", "c", time.time())
    turn_store.insert_raw(conn, [(session, "they retried the backup", "u", time.time())])
    recall_store.clear(conn)
    assert [] == recall_store.search(conn, "retry")
    conn.close()
    writer = start_writer(home)
    try:
        reader = db.open_reader(home.paths.db_file)
        hits = recall_store.search(reader, "retry")
        reader.close()
        assert ["they retried the backup"] == [h.content for h in hits]
        assert '"event":"fts_backfilled"' in writer.log_text()
    finally:
        writer.stop()


def test_a_second_writer_on_the_same_database_refuses_to_start(home):
    first = start_writer(home)
    try:
        second = Proc(home, "writer")
        code = second.popen.wait(20)
        second.stop()
        assert (1, True, True) == (code, f"another writer (pid {first.pid})" in second.log_text(), first.alive())
    finally:
        first.stop()
