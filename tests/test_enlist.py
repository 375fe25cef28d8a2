"""Enlisting under a name, as the writer applies it (services/writer/lease_ops.py) on a real migrated file:
a live predecessor refuses the newcomer, a provably gone one hands its turns and outbox rows over at once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import apsw
import pytest

from common import db, identity
from common.stores import outbox_store, session_store, turn_store, worker_store
from schema import messages as m
from services.writer import apply as ops

T0 = 1_700_000_000.0
HOST = "host-a"


@pytest.fixture
def conn(tmp_path: Path, migrated_file: Path) -> apsw.Connection:
    shutil.copyfile(migrated_file, tmp_path / "starling.db")
    c = db.open_writer(tmp_path / "starling.db")
    yield c
    c.close()


def enlist(conn, worker: str, *, name: str = "runner-0", pid: int | None = None, pid_start: int | None = None,
           host: str = HOST, scope: str | None = None, now: float = T0, stale: float = 180.0):
    pid = os.getpid() if pid is None else pid
    op = m.Enlist(name=name, worker=worker, pid=pid, host=host, stale_after_s=stale,
                  pid_start=identity.process_start(pid) or 0 if pid_start is None else pid_start,
                  pid_scope=identity.pid_scope() if scope is None else scope)
    events: list = []
    return ops.apply(conn, op, now, events), events


def dead_pid() -> tuple[int, int]:
    """(pid, start time) of a process that ran and was reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    start = identity.process_start(proc.pid)
    proc.kill()
    proc.wait(10)
    return proc.pid, start


def held_turn(conn, worker: str, chat: str = "c1") -> int:
    session = session_store.open_session(conn, "default", "tg", chat, T0)
    turn_id = turn_store.add_user_turn(conn, session, "hi", "u", "U", "m1", "", "[]", "{}", T0)
    assert turn_store.claim_next(conn, worker, 60.0, T0).turn_id == turn_id
    return turn_id


def held_row(conn, worker: str, chat: str = "c1") -> int:
    outbox_id = outbox_store.enqueue(conn, None, None, "tg", chat, "hello", "", "", T0)
    assert [outbox_id] == [i.id for i in outbox_store.claim(conn, ["tg"], worker, 10, 60.0, T0)]
    return outbox_id


def test_the_first_process_under_a_name_is_recorded(conn):
    result, _ = enlist(conn, "runner-0@host-a/aaa")
    row = worker_store.get(conn, "runner-0")
    assert (m.Enlisted(), "runner-0@host-a/aaa", os.getpid(), "running") == (result, row.worker, row.pid, row.state)


def test_a_second_live_process_under_the_name_is_refused_naming_the_first(conn):
    enlist(conn, "runner-0@host-a/aaa")
    turn_id = held_turn(conn, "runner-0@host-a/aaa")
    with pytest.raises(ops.Rejected) as refused:
        enlist(conn, "runner-0@host-a/bbb", now=T0 + 5)
    assert "conflict" == refused.value.code
    assert f"pid {os.getpid()} on {HOST}, since 2023-11-14 22:13:20 UTC" in str(refused.value)
    # the first keeps its name and its turn
    assert ("runner-0@host-a/aaa", "claimed") == (worker_store.get(conn, "runner-0").worker,
                                                  turn_store.get(conn, turn_id).state)


def test_a_dead_predecessors_turns_and_rows_are_taken_back_at_once(conn):
    pid, start = dead_pid()
    enlist(conn, "gw@host-a/old", name="gw", pid=pid, pid_start=start)
    turn_id, outbox_id = held_turn(conn, "gw@host-a/old"), held_row(conn, "gw@host-a/old")
    result, events = enlist(conn, "gw@host-a/new", name="gw", now=T0 + 1)
    turn, row = turn_store.get(conn, turn_id), outbox_store.get(conn, outbox_id)
    assert ("gw@host-a/old", [turn_id], [outbox_id]) == (result.predecessor, result.turns, result.outbox)
    # the turn loses no attempt; the row's attempt counts (its send may have gone out)
    assert (("pending", 0), ("pending", 1)) == ((turn.state, turn.attempts), (row.state, row.attempts))
    assert {m.TurnPending, m.OutboxPending} == {cls for _, cls, _ in events}
    assert "gw@host-a/new" == worker_store.get(conn, "gw").worker


def test_a_reused_pid_is_not_the_predecessor(conn):
    enlist(conn, "runner-0@host-a/old", pid_start=1)  # this pid, but a process that started at another time
    result, _ = enlist(conn, "runner-0@host-a/new", now=T0 + 1)
    assert "runner-0@host-a/old" == result.predecessor


def test_a_zombie_predecessor_is_gone(conn):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = identity.process_start(proc.pid)
    enlist(conn, "runner-0@host-a/old", pid=proc.pid, pid_start=start)
    try:
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
        result, _ = enlist(conn, "runner-0@host-a/new", now=T0 + 1)
    finally:
        proc.wait(10)
    assert "runner-0@host-a/old" == result.predecessor


def test_a_predecessor_that_said_it_stopped_is_gone(conn):
    enlist(conn, "runner-0@host-a/old")
    ops.apply(conn, m.Heartbeat(service="runner-0", pid=os.getpid(), state="stopped", worker="runner-0@host-a/old"),
              T0 + 1, [])
    result, _ = enlist(conn, "runner-0@host-a/new", now=T0 + 2)
    assert "runner-0@host-a/old" == result.predecessor


def test_where_its_pid_cannot_be_looked_up_silence_longer_than_stale_after_means_gone(conn):
    other = "another-boot:pid:[1]"
    enlist(conn, "runner-0@host-b/old", host="host-b", scope=other)
    with pytest.raises(ops.Rejected):
        enlist(conn, "runner-0@host-a/new", now=T0 + 100, stale=180)
    ops.apply(conn, m.Heartbeat(service="runner-0", pid=1, worker="runner-0@host-b/old"), T0 + 150, [])
    with pytest.raises(ops.Rejected):
        enlist(conn, "runner-0@host-a/new", now=T0 + 300, stale=180)  # its beat at T0+150 keeps it alive
    result, _ = enlist(conn, "runner-0@host-a/new", now=T0 + 331, stale=180)
    assert "runner-0@host-b/old" == result.predecessor


def test_a_host_that_rebooted_took_its_processes_with_it(conn):
    enlist(conn, "runner-0@host-a/old", scope="boot-before:pid:[1]")
    result, _ = enlist(conn, "runner-0@host-a/new", scope="boot-after:pid:[1]", now=T0 + 1)
    assert "runner-0@host-a/old" == result.predecessor


def test_a_superseded_process_hears_so_on_its_next_beat(conn):
    pid, start = dead_pid()
    enlist(conn, "runner-0@host-a/old", pid=pid, pid_start=start)
    enlist(conn, "runner-0@host-a/new", now=T0 + 1)
    with pytest.raises(ops.Rejected) as refused:
        ops.apply(conn, m.Heartbeat(service="runner-0", pid=pid, worker="runner-0@host-a/old"), T0 + 2, [])
    assert "conflict" == refused.value.code and "superseded" in str(refused.value)


def test_the_same_process_enlisting_again_changes_nothing(conn):
    enlist(conn, "runner-0@host-a/aaa")
    turn_id = held_turn(conn, "runner-0@host-a/aaa")
    result, _ = enlist(conn, "runner-0@host-a/aaa", now=T0 + 1)
    assert (m.Enlisted(), "claimed") == (result, turn_store.get(conn, turn_id).state)


def test_the_first_under_a_name_takes_back_rows_a_gateway_of_before_held_as_name_at_host(conn):
    outbox_id = held_row(conn, "gw@host-a")  # the worker id gateways had before workers were recorded
    result, _ = enlist(conn, "gw@host-a/new", name="gw")
    assert ("gw@host-a", [outbox_id], "pending") == (result.predecessor, result.outbox,
                                                      outbox_store.get(conn, outbox_id).state)
