"""The clock moved ±1 day under leases and retention, without touching the machine's clock: the writer's
real functions (and the real writer loop, in-process, over real sockets) on a lease clock whose wall and
boottime sources are fakes (services/writer/lease_clock.py)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common import db
from common.service import Service
from common.stores import audit_store, db_store, lease_clock_store, outbox_store, session_store, turn_store
from schema import messages as m
from services.sweeper.retention import Retention
from services.writer import apply as ops
from services.writer import lease_clock, startup
from services.writer.lease_clock import LeaseClock
from services.writer.main import Writer
from tests.procs import REPO, make_home, remove_home, start_writer

DAY = 86400.0
T0 = 1_800_000_000.0


class FakeTime:
    """A wall clock that can jump, beside a boot clock that only moves forward."""

    def __init__(self, wall: float = T0, since_boot: float = 1000.0) -> None:
        self.now, self.since_boot = wall, since_boot

    def wall(self) -> float:
        return self.now

    def boottime(self) -> float:
        return self.since_boot

    def passes(self, seconds: float) -> None:
        self.now += seconds
        self.since_boot += seconds

    def jumps(self, seconds: float) -> None:  # the wall clock set, nothing else
        self.now += seconds


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict]] = []

    def bind(self, **_kw):
        return self

    def __getattr__(self, level):
        return lambda event, **kw: self.lines.append((level, event, kw))

    def events(self, name: str) -> list[dict]:
        return [kw for _, event, kw in self.lines if event == name]


@pytest.fixture
def conn(tmp_path: Path, migrated_file: Path):
    shutil.copyfile(migrated_file, tmp_path / "starling.db")
    c = db.open_writer(tmp_path / "starling.db")
    yield c
    lease_clock.install(None)
    c.close()


def booted(conn, t: FakeTime, boot_id: str = "boot-1", log=None, alert_to: str = "") -> LeaseClock:
    clock = LeaseClock.boot(conn, wall=t.wall, boottime=t.boottime, host_boot=lambda: boot_id, log=log,
                            alert_to=alert_to)
    lease_clock.install(clock)
    return clock


def write(conn, clock: LeaseClock, op: m.WriteOp):
    """One write as the writer applies it: stamped by its clock, in a transaction."""
    db_store.begin(conn)
    try:
        result = ops.apply(conn, op, clock.stamp(), [])
        db_store.commit(conn)
        return result
    except BaseException:
        db_store.rollback(conn)
        raise


def pending_turn(conn, chat: str = "c1") -> int:
    session = session_store.open_session(conn, "default", "tg", chat, T0)
    return turn_store.add_user_turn(conn, session, "hi", "u", "U", "m1", "", "[]", "{}", T0)


# ---------------------------------------------------------------- the clock itself


def test_the_first_start_reads_the_wall_clock(conn):
    t = FakeTime()
    clock = booted(conn, t)
    assert (T0, 0.0) == (clock.lease(), lease_clock_store.get(conn).skew)


def test_a_writer_restarted_on_the_same_host_boot_carries_the_clock_on_exactly(conn):
    t = FakeTime()
    first = booted(conn, t).lease()
    t.passes(100)  # the writer is down for 100 s...
    t.jumps(DAY)  # ...and the wall clock is set a day ahead meanwhile
    again = booted(conn, t)
    assert first + 100 == again.lease()
    assert DAY == lease_clock_store.get(conn).jump_s


def test_a_new_host_boot_goes_on_from_the_last_reading_and_never_back(conn):
    t = FakeTime()
    clock = booted(conn, t)
    t.passes(50)
    clock.persist(conn)
    last = clock.lease()
    t.since_boot = 5.0  # rebooted: the boot clock starts again
    t.jumps(600)
    assert last + 600 == booted(conn, t, boot_id="boot-2").lease()  # the wall clock's word for the gap
    t.since_boot = 7.0
    t.jumps(-DAY)  # an RTC a day behind after the next reboot
    after = booted(conn, t, boot_id="boot-3").lease()
    assert last + 600 <= after < last + 601
    assert not lease_clock_store.get(conn).holds_retention


def test_a_new_host_boot_more_than_a_day_later_holds_retention_until_confirmed(conn):
    t = FakeTime()
    booted(conn, t).persist(conn)
    t.since_boot = 5.0
    t.jumps(3 * DAY)  # off for three days, or a clock three days ahead: the same to us
    clock = booted(conn, t, boot_id="boot-2")
    assert lease_clock_store.get(conn).holds_retention
    confirmed = write(conn, clock, m.ConfirmClock(by="cli:ops"))
    assert (True, 3 * DAY) == (confirmed.held, pytest.approx(confirmed.jump_s))
    assert not lease_clock_store.get(conn).holds_retention


# ---------------------------------------------------------------- leases


@pytest.mark.parametrize("jump", [DAY, -DAY])
def test_a_wall_clock_jump_of_a_day_neither_expires_a_live_lease_nor_keeps_a_dead_one(conn, jump):
    t = FakeTime()
    clock = booted(conn, t)
    turn_id = pending_turn(conn)
    outbox_id = outbox_store.enqueue(conn, None, None, "tg", "c1", "hello", "", "", T0)
    claim = write(conn, clock, m.ClaimTurn(worker="a", lease_s=60))
    row = write(conn, clock, m.ClaimOutbox(worker="a", instances=["tg"], lease_s=60)).items[0]
    t.passes(1)
    t.jumps(jump)
    # live: another worker finds nothing, the holder renews
    assert m.NoWork() == write(conn, clock, m.ClaimTurn(worker="b", lease_s=60))
    assert [] == write(conn, clock, m.ClaimOutbox(worker="b", instances=["tg"], lease_s=60)).items
    write(conn, clock, m.RenewLease(kind="turn", id=turn_id, worker="a", lease_s=60))
    t.passes(59)  # 59 s after the renewal: still held
    assert m.NoWork() == write(conn, clock, m.ClaimTurn(worker="b", lease_s=60))
    t.passes(2)  # the turn's renewed lease and the row's lease ran out on the lease clock: taken again
    retaken = write(conn, clock, m.ClaimTurn(worker="b", lease_s=60))
    rows = write(conn, clock, m.ClaimOutbox(worker="b", instances=["tg"], lease_s=60)).items
    assert (turn_id, outbox_id) == (claim.turn_id, row.id)
    assert (turn_id, [outbox_id]) == (retaken.turn_id, [r.id for r in rows])


def test_a_retry_time_is_kept_on_the_lease_clock(conn):
    t = FakeTime()
    clock = booted(conn, t)
    outbox_store.enqueue(conn, None, None, "tg", "c1", "hello", "", "", T0)
    item = write(conn, clock, m.ClaimOutbox(worker="a", instances=["tg"])).items[0]
    write(conn, clock, m.OutboxFailed(id=item.id, worker="a", error="flood", retry_after_s=30))
    t.jumps(-DAY)  # a day back: the retry must not wait a day more
    t.passes(31)
    assert [item.id] == [i.id for i in write(conn, clock, m.ClaimOutbox(worker="a", instances=["tg"])).items]


def test_a_predecessor_is_judged_silent_on_the_lease_clock(conn):
    t = FakeTime()
    clock = booted(conn, t)
    elsewhere = dict(pid=1, host="h", pid_scope="other-boot:pid:[1]", stale_after_s=180)
    write(conn, clock, m.Enlist(name="gw", worker="gw@h/old", **elsewhere))
    t.jumps(DAY)  # its last sign of life looks a day old on the wall clock: it is 0 s old
    with pytest.raises(ops.Rejected):
        write(conn, clock, m.Enlist(name="gw", worker="gw@h/new", **elsewhere))


# ---------------------------------------------------------------- retention


def old_session(conn) -> int:
    return session_store.open_session(conn, "default", "tg", "old", T0 - 40 * DAY)


def purge(conn, clock: LeaseClock, t: FakeTime) -> m.Purged:
    return write(conn, clock, m.PurgeSessions(before=t.wall() - 30 * DAY))


def test_after_a_jump_forward_of_more_than_a_day_retention_deletes_nothing_until_confirmed(conn):
    t = FakeTime()
    log = Log()
    clock = booted(conn, t, log=log, alert_to="tg:ops")
    session = session_store.open_session(conn, "default", "tg", "recent", T0 - 20 * DAY)  # 20 days old: kept
    t.jumps(11 * DAY)  # now it looks 31 days old
    clock.on_timer(conn, time.monotonic())
    with pytest.raises(ops.Rejected) as refused:
        purge(conn, clock, t)
    assert ("conflict", session) == (refused.value.code, session_store.get(conn, session).id)
    assert "retention is held" in str(refused.value) and "starling retention confirm-clock" in str(refused.value)
    # a log line and an alert
    assert [pytest.approx(11 * DAY)] == [e["ahead_s"] for e in log.events("clock_jumped")]
    alert = outbox_store.for_chat(conn, "tg", "ops")
    assert 1 == len(alert) and "264.0 h ahead" in alert[0].body
    clock.on_timer(conn, time.monotonic() + 61)  # judged again: not told twice
    assert 1 == len(outbox_store.for_chat(conn, "tg", "ops"))
    # the operator checked the time
    assert write(conn, clock, m.ConfirmClock(by="cli:ops")).held
    assert 1 == purge(conn, clock, t).rows["sessions"]
    assert ["cli:ops"] == [e.actor for e in audit_store.events(conn, "clock_confirmed")]


def test_a_jump_of_less_than_a_day_does_not_hold_retention(conn):
    t = FakeTime()
    clock = booted(conn, t)
    old_session(conn)
    t.jumps(DAY - 60)
    assert 1 == purge(conn, clock, t).rows["sessions"]


def test_a_jump_back_holds_nothing_and_a_later_correction_forward_is_no_jump(conn):
    t = FakeTime()
    clock = booted(conn, t)
    old_session(conn)
    t.jumps(-2 * DAY)
    t.jumps(2 * DAY)  # set right again
    assert 1 == purge(conn, clock, t).rows["sessions"]


def test_the_sweeper_skips_its_pass_while_the_writer_holds_retention(tmp_path, conn):
    t = FakeTime()
    clock = booted(conn, t)
    t.jumps(2 * DAY)
    clock.on_timer(conn, time.monotonic())
    (tmp_path / "home").mkdir()
    home = make_home(root=tmp_path / "home")
    old = home.paths.tool_output_dir / "7" / "old.txt"
    old.parent.mkdir(parents=True)
    old.write_text("x")
    calls, log = [], Log()
    svc = Service(name="sweeper", paths=home.paths, cfg=home.cfg, log=log, key=home.key, endpoints=home.endpoints,
                  stopping=threading.Event())

    async def call(op):
        calls.append(op)

    reader = db.open_reader(Path(conn.filename))
    report = asyncio.run(Retention(svc, call, lambda: reader, log, memory=None).sweep(t.wall() + 90 * DAY))
    assert ([], 0, True) == (calls, report.steps, old.exists())
    assert 1 == len(log.events("retention_held"))


# ---------------------------------------------------------------- the real writer, its loop and its bus


def test_the_writer_loop_stamps_its_commits_on_the_lease_clock():
    home = make_home("[writer]\nreserve_mb = 0\n")
    t = FakeTime(wall=time.time())
    log = Log()
    svc = Service(name="writer", paths=home.paths, cfg=home.cfg, log=log, key=home.key, endpoints=home.endpoints,
                  stopping=threading.Event())
    ready = threading.Event()

    def serve():
        conn = startup.open_database(svc)
        writer = Writer(svc, conn, clock=LeaseClock.boot(conn, wall=t.wall, boottime=t.boottime,
                                                         host_boot=lambda: "boot-1", log=log))
        ready.set()
        writer.run()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert ready.wait(20)

        async def go():
            async with home.client("test") as c:
                await c.call(m.Inbound(agent="default", instance="tg", chat="c", sender="u", text="hi",
                                       dedupe_keys=["k1"]))
                held = await c.call(m.ClaimTurn(worker="a", lease_s=30))
                t.jumps(DAY)
                during = await c.call(m.ClaimTurn(worker="b", lease_s=30))
                t.jumps(-2 * DAY)
                t.passes(31)
                after = await c.call(m.ClaimTurn(worker="b", lease_s=30))
                return held, during, after

        held, during, after = asyncio.run(go())
        assert (m.NoWork(), held.turn_id) == (during, after.turn_id)
        assert held.lease_until == pytest.approx(T0_of(log) + 30, abs=1)
    finally:
        svc.stopping.set()
        thread.join(20)
        lease_clock.install(None)
        remove_home(home)
    assert not thread.is_alive()


def T0_of(log: Log) -> float:
    return log.events("lease_clock")[0]["lease"]


def test_the_cli_shows_the_clock_check_and_confirms_it():
    home = make_home()
    writer = start_writer(home)
    try:
        def cli(*args):
            return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home.root), "retention", *args],
                                  cwd=REPO, capture_output=True, text=True, timeout=60)

        status, confirmed, after = cli("status", "--json"), cli("confirm-clock"), cli("status")
        conn = db.open_reader(home.paths.db_file)
        with db.read_tx(conn):
            audited = [e.action for e in audit_store.events(conn, "clock_confirmed")]
    finally:
        writer.stop()
        remove_home(home)
    assert (0, 0, 0) == (status.returncode, confirmed.returncode, after.returncode), status.stderr + confirmed.stderr
    assert '"held": false' in status.stdout
    assert confirmed.stdout.startswith("Confirmed (retention was not held")
    assert after.stdout.startswith("Retention runs")
    assert ["clock_confirmed"] == audited
