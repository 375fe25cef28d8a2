"""Twins and restarts, with real processes: a second live runner or gateway under one name refuses to
start, naming the first, and takes nothing of it; a runner or gateway restarted after kill -9 takes its
predecessor's turns or rows back at once, long before their leases run out."""

from __future__ import annotations

import asyncio
import json
import time

from common import db
from common.stores import beat_store, outbox_store, turn_store, worker_store
from schema import messages as m
from tests.procs import Proc, start_writer, wait_until
from tests.runner_stack import GATEWAY, own_home, reader, started
from tests.telegram_stack import OWNER, stack

LEASE_S = 60  # far longer than any wait below: what comes back, came back because it was taken back


def long_lease(text: str) -> str:
    return text.replace("lease_s = 3", f"lease_s = {LEASE_S}")


def send(home, chat: str, text: str) -> m.Accepted:
    async def go():
        async with home.client("gateway") as c:
            return await c.call(m.Inbound(agent="default", instance=GATEWAY, chat=chat, sender="u1", text=text,
                                          dedupe_keys=[f"{chat}:{text}"]))

    return asyncio.run(go())


def call(home, *ops):
    async def go():
        async with home.client("test") as c:
            return [await c.call(op) for op in ops]

    return asyncio.run(go())


def exits(proc: Proc, timeout: float = 30.0) -> int:
    wait_until(lambda: not proc.alive(), timeout=timeout, what=f"{proc.service} to exit")
    return proc.popen.returncode


def events(proc: Proc, event: str) -> list[dict]:
    lines = [json.loads(line) for line in proc.log_text().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event and line.get("pid", proc.pid) == proc.pid]


def worker(home, name: str) -> worker_store.Worker:
    conn = db.open_reader(home.paths.db_file)
    with db.read_tx(conn):
        return worker_store.get(conn, name)


def beat_pid(home, name: str) -> int:
    conn = db.open_reader(home.paths.db_file)
    with db.read_tx(conn):
        return {b.service: b.pid for b in beat_store.all_beats(conn)}[name]


def test_a_second_live_runner_under_one_name_refuses_to_start_and_takes_nothing():
    with own_home(long_lease) as home:
        home.fake.add({"delay": 4.0, "text": "the first runner's answer"})
        started(home, start_writer(home))
        first = started(home, Proc(home, "runner", "--name", "runner-x"))
        wait_until(lambda: events(first, "ready"), timeout=20, what="the first runner to be ready")
        accepted = send(home, "twin", "hello")
        wait_until(lambda: len(home.fake.requests("openai")) >= 1, timeout=15, what="the first runner to hold the turn")
        twin = started(home, Proc(home, "runner", "--name", "runner-x"))
        code = exits(twin)
        refusal = events(twin, "twin_refused")
        wait_until(lambda: turn_store.get(reader(home), accepted.turn_id).state == "done", timeout=20,
                   what="the first runner to answer")
        rows = outbox_store.for_chat(reader(home), GATEWAY, "twin")
        turn = turn_store.get(reader(home), accepted.turn_id)
        assert (1, 1) == (code, len(refusal)), twin.log_text()[-2000:]
        assert f"runner-x is already running: pid {first.pid} on " in refusal[0]["error"]
        assert " since 20" in refusal[0]["error"]  # since when, as a date
        # the first kept its turn (one attempt, one answer), its name and its beat
        assert (["the first runner's answer"], 1, True) == ([r.body for r in rows], turn.attempts, first.alive())
        assert (first.pid, first.pid) == (worker(home, "runner-x").pid, beat_pid(home, "runner-x"))
        assert 1 == len(home.fake.requests("openai"))


def test_a_runner_restarted_after_kill9_takes_its_turn_back_at_once():
    with own_home(long_lease) as home:
        home.fake.add({"delay": 40.0, "text": "never arrives"}, {"text": "the answer"})
        started(home, start_writer(home))
        first = started(home, Proc(home, "runner", "--name", "runner-x"))
        accepted = send(home, "restart", "hello")
        wait_until(lambda: len(home.fake.requests("openai")) >= 1, timeout=20, what="the runner to be in the model")
        first.kill9()
        killed = time.monotonic()
        second = started(home, Proc(home, "runner", "--name", "runner-x"))
        wait_until(lambda: turn_store.get(reader(home), accepted.turn_id).state == "done", timeout=30,
                   what="the restarted runner to answer")
        waited = time.monotonic() - killed
        rows = outbox_store.for_chat(reader(home), GATEWAY, "restart")
        took = events(second, "took_over")
    assert ["the answer"] == [r.body for r in rows]
    assert waited < LEASE_S / 2, f"the turn waited {waited:.1f}s: its lease ran out instead of being taken back"
    assert [[accepted.turn_id]] == [t["turns"] for t in took]


def test_a_second_live_gateway_under_one_name_refuses_to_start_and_takes_nothing():
    with stack() as s:
        first = s.start_gateway()
        name = "gateway-telegram"
        held_by_first = worker(s.home, name).worker
        # a row the first holds (as mid-send): a twin that took the name over would hand it back
        queued, claim = call(s.home, m.EnqueueOutbox(instance="elsewhere", chat="c", replies=[m.Reply(text="held")]),
                             m.ClaimOutbox(worker=held_by_first, instances=["elsewhere"]))
        twin = Proc(s.home, s.service)
        s.extra_procs.append(twin)
        code = exits(twin)
        refusal = [e for e in events(twin, "twin_refused") if e.get("pid") == twin.pid]
        s.tg.message("after the twin", user=OWNER)
        replies = s.replies(OWNER, 1)
        time.sleep(1.0)  # a second copy would come now
        conn = s.reader()
        with db.read_tx(conn):
            row = outbox_store.get(conn, queued.ids[0])
        assert (1, 1) == (code, len(refusal)), twin.log_text()[-2000:]
        assert f"{name} is already running: pid {first.pid} on " in refusal[0]["error"]
        assert ([queued.ids[0]], "claimed") == ([i.id for i in claim.items], row.state)
        assert ["echo: after the twin"] == [r["text"] for r in s.tg.sent(chat_id=OWNER)] == [r["text"] for r in replies]
        assert (True, first.pid) == (first.alive(), worker(s.home, name).pid)


def test_a_gateway_restarted_after_kill9_takes_its_rows_back_at_once():
    with stack() as s:
        s.start_gateway()
        name = "gateway-telegram"
        dead = worker(s.home, name).worker
        s.kill_gateway(restart=False)
        # what a gateway killed mid-send leaves: a row claimed under its (now dead) worker id, lease 60 s
        queued, claim = call(s.home, m.EnqueueOutbox(instance="tg", chat=str(OWNER), replies=[m.Reply(text="retaken")]),
                             m.ClaimOutbox(worker=dead, instances=["tg"], lease_s=LEASE_S))
        started_at = time.monotonic()
        s.start_gateway()
        s.replies(OWNER, 1, timeout=LEASE_S / 2)
        waited = time.monotonic() - started_at
        row = s.settled("tg", OWNER)[0]
        assert ([queued.ids[0]], "sent", 2) == ([i.id for i in claim.items], row.state, row.attempts)
        assert waited < LEASE_S / 2
