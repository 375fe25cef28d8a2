"""The rule of durability under kill -9: acked writes survive, every write is acked, none is stored twice."""

from __future__ import annotations

import subprocess
import sys
import time

from common import db
from common.stores import db_store, keys_store, turn_store
from tests.procs import REPO, remove_home, make_home, start_writer, wait_until

PRODUCERS = 4
PER_PRODUCER = 1500


def test_kill9_of_the_writer_during_4_producer_streams_loses_and_doubles_nothing():
    home = make_home()
    acked_files = [home.root / f"acked-{i}.txt" for i in range(PRODUCERS)]
    writer = start_writer(home)
    producers = [
        subprocess.Popen([sys.executable, "-m", "tests.producer", str(home.root), str(i), str(PER_PRODUCER),
                          str(acked_files[i])], cwd=REPO)
        for i in range(PRODUCERS)
    ]
    try:
        kills = 0
        for _ in range(2):  # kill the writer twice mid-stream, each time after some acks landed
            before = sum(_lines(f) for f in acked_files)
            wait_until(lambda: sum(_lines(f) for f in acked_files) >= before + 300, 60, what="acks to flow")
            writer.kill9()
            kills += 1
            acked_at_kill = {key for f in acked_files for key in _keys(f)}
            time.sleep(0.3)
            writer = start_writer(home)
            conn = db.open_reader(home.paths.db_file)
            with db.read_tx(conn):
                lost = [k for k in acked_at_kill if keys_store.inbound_turn(conn, [k]) is None]
            conn.close()
            assert [] == lost
        for p in producers:
            assert 0 == p.wait(120)
        acked = [key for f in acked_files for key in _keys(f)]
        conn = db.open_reader(home.paths.db_file)
        with db.read_tx(conn):
            turn_ids = {keys_store.inbound_turn(conn, [k]) for k in acked}
            stored = turn_store.count(conn)
            integrity = db_store.integrity_check(conn)
        conn.close()
        expected = PRODUCERS * PER_PRODUCER
        assert (2, expected, expected, expected, ["ok"]) == (kills, len(set(acked)), len(turn_ids), stored, integrity)
    finally:
        for p in producers:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        writer.stop()
        remove_home(home)


def _keys(path) -> list[str]:
    try:
        return [line for line in path.read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def _lines(path) -> int:
    return len(_keys(path))
