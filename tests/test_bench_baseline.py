"""The writer benchmark's raw baseline stores what a bus write stores: the turn, its inbound key, its session touched."""

from __future__ import annotations

from pathlib import Path

from common import db
from common.stores import db_store, keys_store, schema_store, session_store, turn_store


def test_bulk_helpers_store_the_rows_a_bus_write_stores(tmp_path: Path) -> None:
    db_file = tmp_path / "starling.db"
    conn = db.open_writer(db_file)
    try:
        schema_store.migrate(conn, db_file)
        db_store.begin(conn)
        first = session_store.open_session(conn, "default", "bench", "c0", 10.0)
        second = session_store.open_session(conn, "default", "bench", "c1", 10.0)
        db_store.commit(conn)

        db_store.begin(conn)
        session_store.touch_many(conn, [(20.0, first), (30.0, second)])
        turn_store.insert_raw(conn, [(first, "one", "u0", 20.0), (second, "two", "u1", 30.0)])
        keys_store.remember_inbound_many(conn, [("bench:0:0", 1, 20.0), ("bench:1:0", 2, 30.0)])
        db_store.commit(conn)

        with db.read_tx(conn):
            assert turn_store.count(conn) == 2
            assert keys_store.inbound_turn(conn, ["bench:1:0"]) == 2
            assert turn_store.session_of(conn, 2) == second
            assert session_store.get(conn, first).last_active_at == 20.0
            assert session_store.get(conn, second).last_active_at == 30.0
    finally:
        conn.close()
