"""The scheduler end to end: real writer and scheduler processes on a real SQLite file, a test clock
passed in (tests/clocked_scheduler.py, the file named by STARLING_TEST_CLOCK) so that hours of schedule pass in seconds, and a fake runner in the test that answers
(or fails) the turns the fires make."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from common import cron, db
from common.personas import create_pack
from common.secrets import set_secret
from common.stores import cron_store, outbox_store, turn_store
from schema import messages as m
from tests.clocks import SCHEDULER_ENV as ENV
from tests.fake_models import FakeModelsProcess
from tests.procs import Proc, make_home, remove_home, start_writer, wait_until

GATEWAY = "tg"
CONFIG = f"""
[scheduler]
poll_interval_s = 30
max_consecutive_failures = 3

[health]
alert_to = "{GATEWAY}:ops"

[[gateways.telegram]]
id = "{GATEWAY}"
"""


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


class VirtualClock:
    """The file the scheduler reads its time from: ``virtual + (real now - real) * scale``."""

    def __init__(self, path) -> None:
        self.path = path

    def set(self, virtual: float, scale: float) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"virtual": virtual, "real": time.time(), "scale": scale}))
        os.replace(tmp, self.path)

    def now(self) -> float:
        data = json.loads(self.path.read_text())
        return data["virtual"] + (time.time() - data["real"]) * data["scale"]

    def stop(self) -> None:
        self.set(self.now(), 0)

    def go(self, scale: float) -> None:
        self.set(self.now(), scale)


class FakeRunner:
    """Claims every pending turn and finishes it at once: ok, or failed when ``fail(claim)`` says so."""

    def __init__(self, home, fail=lambda claim: False) -> None:
        self.home = home
        self.fail = fail
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._work()), daemon=True)

    def start(self) -> FakeRunner:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(15)

    async def _work(self) -> None:
        async with self.home.client("fake-runner", timeout_s=0.3) as client:
            while not self.stopping.is_set():
                claim = await client.call(m.ClaimTurn(worker="fake-runner", lease_s=30))
                if not isinstance(claim, m.TurnClaim):
                    await asyncio.sleep(0.01)
                    continue
                failed = self.fail(claim)
                await client.call(m.FinishTurn(turn_id=claim.turn_id, worker="fake-runner", ok=not failed,
                                               error="the model is down" if failed else "", answer="done",
                                               replies=[m.Reply(text=f"answer to: {claim.text}")]))


class Stack:
    """A home with a test clock, its writer, schedulers and a fake runner; everything stops at the end."""

    def __init__(self, home, clock: VirtualClock) -> None:
        self.home = home
        self.clock = clock
        self.writer: Proc | None = None
        self.schedulers: list[Proc] = []
        self.runner: FakeRunner | None = None
        self.others: list = []  # a real runner, a fake model server: stopped at the end

    def start_writer(self) -> None:
        self.writer = start_writer(self.home)

    def start_scheduler(self, name: str = "scheduler") -> Proc:
        proc = Proc(self.home, "scheduler", "--name", name, module="tests.clocked_scheduler")  # its test clock
        self.schedulers.append(proc)
        wait_until(lambda: f'"event":"ready","state":"ready","detail":"","pid":{proc.pid}' in proc.log_text()
                   or not proc.alive(), timeout=20, what=f"{name} ready")
        assert proc.alive(), proc.log_text()[-3000:]
        return proc

    def call(self, op: m.WriteOp):
        async def go():
            async with self.home.client("test") as client:
                return await client.call(op)

        return asyncio.run(go())

    def add(self, name: str, schedule: str = "", tz: str = "UTC", run_at: float = 0.0, since: float | None = None,
            chat: str | None = None) -> int:
        return self.call(m.CronAdd(name=name, prompt=f"prompt of {name}", agent="default", deliver_instance=GATEWAY,
                                   deliver_chat=chat or name, schedule=schedule, tz=tz, run_at=run_at,
                                   active_since=self.clock.now() if since is None else since)).id

    def runs(self, name: str) -> list[cron_store.ListedRun]:
        conn = db.open_reader(self.home.paths.db_file)
        try:
            with db.read_tx(conn):
                return sorted(cron_store.recent_runs(conn, name, 100_000), key=lambda r: r.scheduled_for)
        finally:
            conn.close()

    def job(self, name: str) -> cron_store.CronJob:
        conn = db.open_reader(self.home.paths.db_file)
        try:
            with db.read_tx(conn):
                return cron_store.get_by_name(conn, name)
        finally:
            conn.close()

    def turns_in(self, chat: str) -> int:
        conn = db.open_reader(self.home.paths.db_file)
        try:
            with db.read_tx(conn):
                return sum(1 for row in turn_store.user_turn_times(conn, GATEWAY, 0) if row[1] == chat)
        finally:
            conn.close()

    def outbox_to(self, chat: str) -> list[str]:
        conn = db.open_reader(self.home.paths.db_file)
        try:
            with db.read_tx(conn):
                return [row.body for row in outbox_store.for_chat(conn, GATEWAY, chat)]
        finally:
            conn.close()

    def wait_runs(self, name: str, count: int, timeout: float = 20, ended: bool = True) -> list:
        """Wait for ``count`` runs of a job (each with its outcome recorded, when ``ended``)."""
        def enough():
            runs = self.runs(name)
            return len(runs) >= count and (not ended or all(r.state != "fired" for r in runs))
        wait_until(enough, timeout=timeout, interval=0.02, what=f"{count} runs of {name}")
        return self.runs(name)


@pytest.fixture
def stack(monkeypatch):
    home = make_home(CONFIG)
    clock = VirtualClock(home.root / "clock.json")
    monkeypatch.setenv(ENV, str(clock.path))
    s = Stack(home, clock)
    try:
        yield s
    finally:
        if s.runner is not None:
            s.runner.stop()
        for proc in [*s.schedulers, *reversed(s.others)]:
            proc.stop()
        if s.writer is not None:
            s.writer.stop()
        remove_home(home)


def expected(schedule: str, tz: str, after: float, until: float) -> list[float]:
    """croniter's own fire times in (after, until] (no daylight-saving change in between)."""
    times, it = [], croniter(schedule, datetime.fromtimestamp(after, ZoneInfo(tz)))
    while (t := it.get_next(float)) <= until:
        times.append(t)
    return times


def errors(runs) -> list[tuple[str, str, str]]:
    """What a failed assertion shows: each run's time, state and error."""
    return [(cron.local_iso(r.scheduled_for, r.tz), r.state, r.error) for r in runs]


# ---------------------------------------------------------------- exact times across restarts


def test_an_every_minute_job_fires_at_croniters_times_across_a_scheduler_and_a_writer_restart(stack):
    v0 = at("2025-01-15T08:00:30+00:00")
    stack.clock.set(v0, 0)
    stack.start_writer()
    stack.add("minutely", "* * * * *", since=v0)
    stack.runner = FakeRunner(stack.home).start()
    first = stack.start_scheduler()
    stack.clock.go(120)  # a minute every half second
    stack.wait_runs("minutely", 3)
    stack.clock.stop()  # kill -9 and restart the scheduler while the clock stands still: every fire stays due
    first.kill9()
    stack.start_scheduler("scheduler-2")
    stack.clock.go(120)
    stack.wait_runs("minutely", 5)
    # the writer goes away, then a fire comes due: it is sent while the writer is down and lands when it is back
    stack.clock.stop()
    stack.writer.stop()
    stack.clock.set(cron.next_fire("* * * * *", "UTC", stack.clock.now()) - 0.5, 5)
    time.sleep(0.5)
    stack.start_writer()
    stack.wait_runs("minutely", 6)  # still slow: resends after the writer's return take a second or two
    stack.clock.go(120)
    stack.wait_runs("minutely", 8)
    stack.clock.stop()
    runs = stack.wait_runs("minutely", 8)
    times = [r.scheduled_for for r in runs]
    assert expected("* * * * *", "UTC", v0, times[-1]) == times
    assert (["ok"] * len(runs), len(runs)) == ([r.state for r in runs], stack.turns_in("minutely")), errors(runs)
    assert 8 <= len(runs)


def test_an_hourly_job_fires_at_croniters_times_across_a_scheduler_and_a_writer_restart(stack):
    v0 = at("2025-01-15T08:40:00+01:00")
    stack.clock.set(v0, 0)
    stack.start_writer()
    stack.add("hourly", "0 * * * *", tz="Europe/Berlin", since=v0)
    stack.runner = FakeRunner(stack.home).start()
    first = stack.start_scheduler()
    stack.clock.go(7200)  # two hours a second
    stack.wait_runs("hourly", 3)
    stack.clock.stop()
    first.stop()
    stack.start_scheduler("scheduler-2")
    stack.clock.go(7200)
    stack.wait_runs("hourly", 5)
    stack.clock.stop()
    stack.writer.kill9()  # then a fire comes due while it is down
    stack.clock.set(cron.next_fire("0 * * * *", "UTC", stack.clock.now()) - 60, 300)
    time.sleep(0.5)
    stack.start_writer()
    stack.wait_runs("hourly", 6)  # still slow: resends after the writer's return take a second or two
    stack.clock.go(7200)
    stack.wait_runs("hourly", 8)
    stack.clock.stop()
    runs = stack.wait_runs("hourly", 8)
    times = [r.scheduled_for for r in runs]
    assert expected("0 * * * *", "Europe/Berlin", v0, times[-1]) == times
    assert ("2025-01-15T09:00+01:00", ["ok"] * len(runs)) == (cron.local_iso(times[0], "Europe/Berlin"),
                                                              [r.state for r in runs]), errors(runs)
    assert len(runs) == stack.turns_in("hourly")


def test_two_schedulers_at_once_never_fire_a_time_twice(stack):
    v0 = at("2025-01-15T08:00:50+00:00")
    stack.clock.set(v0, 0)
    stack.start_writer()
    stack.add("shared", "* * * * *", since=v0)
    stack.add("shared-2", "*/2 * * * *", since=v0)
    stack.runner = FakeRunner(stack.home).start()
    a, b = stack.start_scheduler("scheduler-a"), stack.start_scheduler("scheduler-b")
    stack.clock.go(120)
    stack.wait_runs("shared", 6)
    stack.clock.stop()
    runs, runs_2 = stack.wait_runs("shared", 6), stack.wait_runs("shared-2", 3)
    assert expected("* * * * *", "UTC", v0, runs[-1].scheduled_for) == [r.scheduled_for for r in runs]
    assert expected("*/2 * * * *", "UTC", v0, runs_2[-1].scheduled_for) == [r.scheduled_for for r in runs_2]
    assert (len(runs), len(runs_2)) == (stack.turns_in("shared"), stack.turns_in("shared-2"))
    assert {"ok"} == {r.state for r in runs + runs_2}, errors(runs + runs_2)
    assert (True, True) == (a.alive(), b.alive())
    fired = [line for line in a.log_text().splitlines() if '"event":"cron_fired"' in line]  # both log to one file
    assert 0 < min(sum(f'"pid":{proc.pid}' in line for line in fired) for proc in (a, b))  # both really fired


def test_a_second_fire_of_the_same_time_is_a_no_op_whatever_its_key(stack):
    stack.clock.set(at("2025-01-15T08:00:00+00:00"), 0)
    stack.start_writer()
    job_id = stack.add("twice", "* * * * *")
    fire = m.CronFire(job_id=job_id, scheduled_for=at("2025-01-15T08:01:00+00:00"))
    first, second = stack.call(fire), stack.call(fire)  # each call has its own idempotency key
    assert (False, True, first.turn_id) == (first.duplicate, second.duplicate, second.turn_id)
    assert (1, 1) == (len(stack.runs("twice")), stack.turns_in("twice"))


# ---------------------------------------------------------------- misfires and daylight saving


def test_after_downtime_the_latest_missed_fire_runs_late_once_and_older_ones_are_skipped(stack):
    v0 = at("2025-01-15T00:58:30+00:00")
    stack.clock.set(v0, 0)
    stack.start_writer()
    stack.add("minutely", "* * * * *", since=v0)
    stack.add("hourly", "0 * * * *", since=v0)
    stack.add("once", run_at=at("2025-01-15T03:00:00+00:00"), since=v0)
    stack.runner = FakeRunner(stack.home).start()
    scheduler = stack.start_scheduler()
    stack.clock.go(60)
    stack.wait_runs("hourly", 1)
    stack.clock.stop()
    scheduler.kill9()
    before = stack.wait_runs("minutely", 2)
    # down until 03:20:10: the every-minute job's 03:20 is 10 s late (grace 30 s), the hourly's 03:00 is 20 min
    # late (grace 30 min), the one-shot's 03:00 is 20 min late (grace 1 h): each runs once, late
    stack.clock.set(at("2025-01-15T03:20:10+00:00"), 0)
    stack.start_scheduler("scheduler-2")
    minutely = stack.wait_runs("minutely", len(before) + 140)
    hourly, once = stack.wait_runs("hourly", 3), stack.wait_runs("once", 1)
    skipped = [r.scheduled_for for r in minutely if r.state == "skipped"]
    assert expected("* * * * *", "UTC", before[-1].scheduled_for, at("2025-01-15T03:19:00+00:00")) == skipped
    assert ("ok", at("2025-01-15T03:20:00+00:00")) == (minutely[-1].state, minutely[-1].scheduled_for)
    assert [("ok", "01:00"), ("skipped", "02:00"), ("ok", "03:00")] == [
        (r.state, cron.local_iso(r.scheduled_for, "UTC")[11:16]) for r in hourly]
    assert [("ok", "03:00")] == [(r.state, cron.local_iso(r.scheduled_for, "UTC")[11:16]) for r in once]
    # down again until 05:45:00: the hourly job's 05:00 is 45 min late, past its grace: skipped, not run
    stack.schedulers[-1].kill9()
    stack.clock.set(at("2025-01-15T05:45:00+00:00"), 0)
    stack.start_scheduler("scheduler-3")
    hourly = stack.wait_runs("hourly", 5)
    assert [("skipped", "04:00"), ("skipped", "05:00")] == [
        (r.state, cron.local_iso(r.scheduled_for, "UTC")[11:16]) for r in hourly[3:]]
    assert "more than the misfire grace of 1800s" in hourly[4].error
    minutely = stack.wait_runs("minutely", len(minutely) + 145)
    fired = [r for r in minutely if r.state != "skipped"]
    assert len(fired) == stack.turns_in("minutely")  # one turn per fired run: nothing replayed in a burst
    assert len(before) + 2 == len(fired)


def test_daylight_saving_in_berlin_neither_skips_nor_doubles_a_wall_clock_job(stack):
    spring = at("2025-03-30T00:10+01:00")
    stack.clock.set(spring, 0)
    stack.start_writer()
    stack.add("spring-daily", "30 2 * * *", tz="Europe/Berlin", since=spring)
    stack.add("spring-hourly", "0 * * * *", tz="Europe/Berlin", since=spring)
    stack.runner = FakeRunner(stack.home).start()
    stack.start_scheduler()
    stack.clock.go(7200)
    stack.wait_runs("spring-hourly", 4)
    for name in ("spring-daily", "spring-hourly"):
        stack.call(m.CronSetEnabled(name=name, enabled=False))
    stack.clock.stop()
    fall = at("2025-10-26T00:10+02:00")
    stack.clock.set(fall, 0)
    stack.add("fall-daily", "30 2 * * *", tz="Europe/Berlin", since=fall)
    stack.add("fall-hourly", "0 * * * *", tz="Europe/Berlin", since=fall)
    stack.clock.go(7200)
    stack.wait_runs("fall-hourly", 5)
    stack.clock.stop()

    def shown(name):
        return [(r.state, cron.local_iso(r.scheduled_for, "Europe/Berlin")) for r in stack.runs(name)]

    assert [("ok", "2025-03-30T03:00+02:00")] == shown("spring-daily")
    assert [("ok", "2025-03-30T01:00+01:00"), ("ok", "2025-03-30T03:00+02:00"), ("ok", "2025-03-30T04:00+02:00"),
            ("ok", "2025-03-30T05:00+02:00")] == shown("spring-hourly")[:4]
    assert [("ok", "2025-10-26T02:30+02:00")] == shown("fall-daily")
    assert [("ok", "2025-10-26T01:00+02:00"), ("ok", "2025-10-26T02:00+02:00"), ("ok", "2025-10-26T02:00+01:00"),
            ("ok", "2025-10-26T03:00+01:00"), ("ok", "2025-10-26T04:00+01:00")] == shown("fall-hourly")[:5]


# ---------------------------------------------------------------- failures


def test_a_job_failing_three_times_in_a_row_is_disabled_and_alerts_once(stack):
    outcomes = iter([True, False, True, True, True])  # fail, succeed (resets the count), then fail 3 times
    v0 = at("2025-01-15T08:00:50+00:00")
    stack.clock.set(v0, 0)
    stack.start_writer()
    stack.add("flaky", "* * * * *", since=v0)
    stack.runner = FakeRunner(stack.home, fail=lambda claim: next(outcomes, False)).start()
    scheduler = stack.start_scheduler()
    stack.clock.go(120)
    wait_until(lambda: not stack.job("flaky").enabled, timeout=20, what="flaky disabled")
    stack.clock.set(stack.clock.now() + 240, 120)  # four more minutes pass: a disabled job does not fire
    time.sleep(0.6)
    stack.clock.stop()
    job, runs = stack.job("flaky"), stack.runs("flaky")
    assert ["failed", "ok", "failed", "failed", "failed"] == [r.state for r in runs]
    assert ("the model is down", True) == (runs[-1].error, runs[-1].duration_ms is not None)
    assert (0, 3, True) == (job.enabled, job.consecutive_failures, job.disabled_reason.startswith("3 consecutive"))
    alerts = stack.outbox_to("ops")
    assert 1 == len(alerts)
    assert "cron job 'flaky' failed 3 times in a row" in alerts[0]
    assert 1 == scheduler.log_text().count('"event":"cron_job_disabled"')
    assert '"level":"warning","service":"scheduler","event":"cron_job_disabled"' in scheduler.log_text()


def test_a_job_added_while_the_scheduler_sleeps_wakes_it_and_fires_on_time(stack, monkeypatch):
    monkeypatch.delenv(ENV)  # the real clock: the scheduler sleeps for the poll interval (30 s) with no jobs
    stack.start_writer()
    stack.runner = FakeRunner(stack.home).start()
    stack.start_scheduler()
    time.sleep(0.3)
    run_at = time.time() + 1.0
    stack.add("soon", run_at=run_at, since=time.time())
    runs = stack.wait_runs("soon", 1, timeout=10)
    assert (run_at, "ok") == (runs[0].scheduled_for, runs[0].state)
    assert runs[0].started_at - run_at < 0.5  # woken by the writer's cron event, not 30 s later by the poll


def test_a_run_is_a_turn_of_the_jobs_agent_whose_answer_goes_to_the_chat(stack, monkeypatch):
    monkeypatch.delenv(ENV)  # the real clock, a real runner and a fake model
    fake = FakeModelsProcess(stack.home.root / "fake").start()
    stack.others.append(fake)
    stack.home = make_home(CONFIG + f"""
[runner]
processes = 1

[providers.default]
kind = "openai"
base_url = "{fake.openai_url}"
api_key = "openai"
model = "fake-model"
""", root=stack.home.root)
    set_secret(stack.home.paths.secrets_file, "openai", "sk-test-not-a-real-key-1234")
    create_pack(stack.home.paths, "default")
    stack.start_writer()
    stack.others.append(Proc(stack.home, "runner"))
    stack.start_scheduler()
    run_at = time.time() + 1.0
    stack.add("reminder", run_at=run_at, since=time.time(), chat="42")
    runs = stack.wait_runs("reminder", 1, timeout=20)
    asked = fake.requests("openai")[-1]["body"]["messages"][-1]["content"]
    assert ("ok", run_at, True) == (runs[0].state, runs[0].scheduled_for, runs[0].duration_ms >= 0)
    assert ("prompt of reminder" in asked, ["echo: " + asked]) == (True, stack.outbox_to("42"))
