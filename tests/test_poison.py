"""Poison: a turn that crashes its runner on every attempt is failed, with a message to the person, an
alert and an audit row, and the other turns its runner held lose no attempt. The rules as the writer
applies them on a real file, then a real runner that a poison turn SIGKILLs, again and again."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import db, identity
from common.stores import audit_store, outbox_store, session_store, turn_store
from schema import messages as m
from services.writer import apply as ops
from tests.procs import Proc, start_writer, wait_until
from tests.runner_stack import GATEWAY, own_home, reader, started

T0 = 1_700_000_000.0
ALERT_TO = "tg:ops"


@pytest.fixture
def conn(tmp_path: Path, migrated_file: Path):
    shutil.copyfile(migrated_file, tmp_path / "starling.db")
    c = db.open_writer(tmp_path / "starling.db")
    yield c
    c.close()


def write(conn, op: m.WriteOp, now: float = T0):
    return ops.apply(conn, op, now, [])


def dead_pid() -> tuple[int, int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    start = identity.process_start(proc.pid)
    proc.kill()
    proc.wait(10)
    return proc.pid, start


def enlist(conn, worker: str, pid: int | None = None, start: int | None = None, now: float = T0):
    pid = os.getpid() if pid is None else pid
    start = identity.process_start(pid) if start is None else start
    return write(conn, m.Enlist(name="runner-0", worker=worker, pid=pid, pid_start=start, host="h",
                                pid_scope=identity.pid_scope(), alert_to=ALERT_TO), now)


def message(conn, chat: str, text: str = "hi") -> int:
    session = session_store.open_session(conn, "default", "tg", chat, T0)
    return turn_store.add_user_turn(conn, session, text, "u", "U", f"msg-{chat}", "", "[]", "{}", T0)


def crash_holding(conn, chats: list[str], worker: str) -> list[int]:
    """A runner (a dead pid) that claims a turn of each chat; then it is gone without a word."""
    pid, start = dead_pid()
    enlist(conn, worker, pid, start)
    ids = [message(conn, chat) for chat in chats]
    assert sorted(ids) == sorted(write(conn, m.ClaimTurn(worker=worker)).turn_id for _ in chats)
    return ids


def test_the_one_turn_a_crashed_runner_held_counts_a_crash_and_no_attempt(conn):
    [turn_id] = crash_holding(conn, ["a"], "runner-0@h/1")
    enlisted = enlist(conn, "runner-0@h/2", now=T0 + 1)
    turn = turn_store.get(conn, turn_id)
    assert ([turn_id], "pending", 0, (1, False)) == (enlisted.turns, turn.state, turn.attempts,
                                                     turn_store.crashes(conn, turn_id))


def test_a_turn_held_with_others_at_a_crash_is_a_suspect_and_loses_no_attempt(conn):
    ids = crash_holding(conn, ["a", "b", "c"], "runner-0@h/1")
    enlist(conn, "runner-0@h/2", now=T0 + 1)
    assert [(0, (0, True))] * 3 == [(turn_store.get(conn, i).attempts, turn_store.crashes(conn, i)) for i in ids]


def test_a_quarantined_turn_goes_only_to_a_runner_holding_nothing_and_others_are_told_to_drain(conn):
    [suspect] = crash_holding(conn, ["a"], "runner-0@h/1")
    enlist(conn, "runner-0@h/2", now=T0 + 1)
    other = message(conn, "b")
    busy = write(conn, m.ClaimTurn(worker="busy", alone=False))  # holds something: gets the other turn
    nothing = write(conn, m.ClaimTurn(worker="busy", alone=False))
    alone = write(conn, m.ClaimTurn(worker="idle", alone=True))
    assert (other, False, True) == (busy.turn_id, busy.alone, busy.alone_waiting)
    assert m.NoWork(alone_waiting=True) == nothing
    assert (suspect, True) == (alone.turn_id, alone.alone)


def test_a_runner_holding_nothing_gets_quarantined_turns_first(conn):
    [suspect] = crash_holding(conn, ["z"], "runner-0@h/1")
    enlist(conn, "runner-0@h/2", now=T0 + 1)
    message(conn, "a")  # a later turn of another session: the quarantined one still goes first
    assert suspect == write(conn, m.ClaimTurn(worker="idle", alone=True)).turn_id


def test_a_turn_that_crashed_its_runner_alone_three_times_is_failed_told_alerted_and_audited(conn):
    events: list = []
    pid, start = dead_pid()
    turn_id = message(conn, "poison", "the poison")
    later = message(conn, "poison", "after it")
    for n in range(turn_store.MAX_CRASHES):
        enlist(conn, f"runner-0@h/{n}", pid, start)
        assert turn_id == write(conn, m.ClaimTurn(worker=f"runner-0@h/{n}", alone=True)).turn_id
    enlisted = ops.apply(conn, m.Enlist(name="runner-0", worker="runner-0@h/new", pid=os.getpid(),
                                        pid_start=identity.process_start(os.getpid()), host="h",
                                        pid_scope=identity.pid_scope(), alert_to=ALERT_TO), T0 + 5, events)
    turn = turn_store.get(conn, turn_id)
    replies = outbox_store.for_chat(conn, "tg", "poison")
    alerts = outbox_store.for_chat(conn, "tg", "ops")
    [audit] = audit_store.events(conn, "turn_poisoned")
    assert ([], [turn_id]) == (enlisted.turns, enlisted.poisoned)
    assert ("failed", "crashed its runner 3 times") == (turn.state, turn.error)
    assert 1 == len(replies) and replies[0].body.startswith("I could not handle this message")
    assert 1 == len(alerts) and f"turn {turn_id} " in alerts[0].body and "crashed its runner 3 times" in alerts[0].body
    assert (f"turn:{turn_id}", 3) == (audit.target, json.loads(audit.detail)["crashes"])
    # the session goes on with its next turn
    assert {m.OutboxPending, m.TurnPending} <= {cls for _, cls, _ in events}
    assert later == write(conn, m.ClaimTurn(worker="runner-0@h/new")).turn_id


def test_a_crashed_runner_found_through_its_expired_lease_is_taken_back_as_its_successor_would(conn):
    ids = crash_holding(conn, ["a", "b"], "runner-0@h/1")  # 60 s leases; no successor comes
    claim = write(conn, m.ClaimTurn(worker="runner-1@h/1", alone=True), T0 + 61)
    assert (ids[0], True, 1) == (claim.turn_id, claim.alone, claim.attempt)  # the dead run's attempt given back
    assert (0, True) == turn_store.crashes(conn, ids[1])


def test_a_predecessor_that_stopped_cleanly_marks_nothing(conn):
    enlist(conn, "runner-0@h/1")
    turn_id = message(conn, "a")
    write(conn, m.ClaimTurn(worker="runner-0@h/1"))
    write(conn, m.Heartbeat(service="runner-0", pid=1, state="stopped", worker="runner-0@h/1"))
    enlist(conn, "runner-0@h/2", now=T0 + 1)
    assert ("pending", (0, False)) == (turn_store.get(conn, turn_id).state, turn_store.crashes(conn, turn_id))


def test_a_turn_given_up_after_its_attempts_is_told_alerted_and_audited(conn):
    turn_id = message(conn, "stuck")
    for n in range(turn_store.MAX_ATTEMPTS):
        write(conn, m.ClaimTurn(worker=f"w{n}", lease_s=1), T0 + 2 * n)  # each lease runs out, holder unknown
    assert m.NoWork() == write(conn, m.ClaimTurn(worker="last", lease_s=1, alert_to=ALERT_TO), T0 + 100)
    replies = outbox_store.for_chat(conn, "tg", "stuck")
    assert "failed" == turn_store.get(conn, turn_id).state
    assert ["I could not handle this message: it was tried 5 times and never finished. The operator has been told."] \
        == [r.body for r in replies]
    assert 1 == len(outbox_store.for_chat(conn, "tg", "ops"))
    assert [f"turn:{turn_id}"] == [e.target for e in audit_store.events(conn, "turn_gave_up")]


# ---------------------------------------------------------------- a real runner, killed by a poison turn


def alerting(text: str) -> str:
    return (text.replace("lease_s = 3", "lease_s = 60")
            + f'[[gateways.telegram]]\nid = "{GATEWAY}"\ntoken = "tg"\n[health]\nalert_to = "{GATEWAY}:ops"\n')


def send(home, chat: str, text: str) -> int:
    async def go():
        async with home.client("gateway") as c:
            return await c.call(m.Inbound(agent="default", instance=GATEWAY, chat=chat, sender="u1", text=text,
                                          dedupe_keys=[f"{chat}:{text}"]))

    return asyncio.run(go()).turn_id


def test_a_poison_turn_that_sigkills_its_runner_is_failed_and_the_turn_beside_it_loses_nothing():
    """The fake model answers the poison turn by SIGKILLing the runner that asked (as the OOM killer ends
    a runner an answer blew up): the runner dies with no word, on every attempt. Restarted under its name
    each time (as supervisord does), it takes its turns back at once (the leases are 60 s)."""
    with own_home(alerting) as home:
        home.fake.add({"when": "innocent", "delay": 6.0, "text": "never arrives: its runner dies first"},
                      *[{"when": "poison", "kill_client": True}] * 4,
                      {"when": "innocent", "text": "the innocent answer"})
        started(home, start_writer(home))
        runner = started(home, Proc(home, "runner", "--name", "runner-p"))
        began = time.monotonic()
        innocent = send(home, "innocent", "an innocent question")
        wait_until(lambda: len(home.fake.requests("openai")) >= 1, timeout=20, what="the innocent turn in the model")
        poison = send(home, "poison", "the poison question")
        restarts = 0
        while turn_store.get(reader(home), poison).state != "failed":
            assert restarts <= 6 and time.monotonic() - began < 50, "the poison turn was never failed"
            if not runner.alive():
                runner = started(home, Proc(home, "runner", "--name", "runner-p"))
                restarts += 1
            time.sleep(0.05)
        wait_until(lambda: turn_store.get(reader(home), innocent).state == "done", timeout=20,
                   what="the innocent turn to be answered")
        took = time.monotonic() - began
        time.sleep(0.5)
        conn = reader(home)
        with db.read_tx(conn):
            poisoned, calm = turn_store.get(conn, poison), turn_store.get(conn, innocent)
            to_person = [r.body for r in outbox_store.for_chat(conn, GATEWAY, "poison")]
            to_innocent = [r.body for r in outbox_store.for_chat(conn, GATEWAY, "innocent")]
            alerts = [r.body for r in outbox_store.for_chat(conn, GATEWAY, "ops")]
            audited = [e.target for e in audit_store.events(conn, "turn_poisoned")]
        killed = [r["killed"] for r in home.fake.requests("openai") if r.get("killed")]
    assert 4 == len(killed) and len(set(killed)) == 4  # four runners, each killed once: 1 beside the other, 3 alone
    assert ("failed", "crashed its runner 3 times") == (poisoned.state, poisoned.error)
    assert [m_ for m_ in to_person if m_.startswith("I could not handle this message")] == to_person and to_person
    assert 1 == len(alerts) and f"turn {poison} " in alerts[0] and [f"turn:{poison}"] == audited
    # the turn held beside it: answered once, and the crash it lived through cost it no attempt
    assert (["the innocent answer"], 1) == (to_innocent, calm.attempts)
    assert took < 60, f"{took:.0f}s: a lease ran out somewhere instead of the turns being taken back"
