"""The writer on a real full disk (a small tmpfs as data_dir, tests/small_disk.py): it never dies of it,
answers what it cannot store with disk_full (the clients' cue to hold and send again), keeps a reserve
for what must go on (heartbeats, outbox reports, the operator's alert), says so in its heartbeat (so
`status` and /health), and once space returns makes its reserve again and takes everything; and the
error codes and the holding call the clients use (common/holding.py)."""

from __future__ import annotations

import asyncio
import time

import apsw
import pytest

from common import db, health, holding
from common.errors import BusTimeout, WriteRejected
from common.stores import beat_store, turn_store
from schema import messages as m
from services.writer import disk
from tests.procs import make_home, start_writer, wait_until
from tests.small_disk import fill, free, small_disk

RESERVE_MB = 2
CONFIG = (f"[writer]\nreserve_mb = {RESERVE_MB}\ncheckpoint_interval_s = 0.2\n"
          "[health]\nheartbeat_interval_ms = 300\n")


def inbound(n: int, text: str = "") -> m.Inbound:
    return m.Inbound(agent="default", instance="t", chat="c", sender="s", dedupe_keys=[f"t:m:{n}"],
                     text=text or f"message {n}")


def test_error_codes_and_what_clients_wait_out():
    assert disk.code_for(apsw.FullError("database or disk is full")) == "disk_full"
    assert disk.code_for(OSError(28, "No space left on device")) == "disk_full"
    assert disk.code_for(apsw.IOError("disk I/O error")) == "io_error"
    assert disk.code_for(apsw.BusyError("database is locked")) == "busy"
    assert disk.code_for(apsw.SQLError("no such table")) == "internal"
    for code in ("disk_full", "io_error", "busy"):
        assert holding.condition(WriteRejected(code, "x")) and not holding.refusal(WriteRejected(code, "x"))
    for code in ("invalid", "too_large"):
        assert holding.refusal(WriteRejected(code, "x")) and not holding.condition(WriteRejected(code, "x"))
    assert holding.condition(BusTimeout("no ack")) and holding.condition(OSError(28, "full"))
    assert not holding.condition(WriteRejected("lease_lost", "x")) and not holding.condition(ValueError("bug"))


class FlakyClient:
    """Answers disk_full ``times`` times, then stores; records the key of every attempt."""

    def __init__(self, times: int, then: Exception | None = None) -> None:
        self.times, self.then, self.keys = times, then, []

    def new_key(self) -> str:
        return "k1"

    async def call(self, op, key=None):
        self.keys.append(key)
        if len(self.keys) <= self.times:
            raise WriteRejected("disk_full", "the data disk is full")
        if self.then is not None:
            raise self.then
        return m.Done()


def test_a_held_write_is_sent_again_under_one_key_until_stored(monkeypatch):
    monkeypatch.setattr(holding, "FIRST_S", 0.001)
    monkeypatch.setattr(holding, "MAX_S", 0.001)
    client = FlakyClient(times=30)
    assert asyncio.run(holding.call(client, m.Ping())) == m.Done()
    assert client.keys == ["k1"] * 31  # past any count of tries: the same key every time

    refused = FlakyClient(times=2, then=WriteRejected("invalid", "bad"))
    with pytest.raises(WriteRejected, match="invalid"):
        asyncio.run(holding.call(refused, m.Ping()))


def test_the_writer_waits_out_a_full_disk_and_its_reserve_carries_what_must_go_on():
    with small_disk(24) as root:
        home = make_home(CONFIG, root=root)
        data = home.paths.data_dir
        ballast = data / disk.BALLAST
        writer = start_writer(home)
        try:
            assert ballast.stat().st_size == RESERVE_MB * 2**20
            pid = writer.pid
            answered = asyncio.run(_fill_and_write(home))
            refused_at, stored_before = answered
            assert refused_at is not None, "a full disk never refused a write"
            assert not ballast.exists()  # freed for what must go on

            async def essentials():
                async with home.client("t", timeout_s=0.2, deadline_s=10) as c:
                    await c.call(m.Heartbeat(service="runner-x", pid=123, state="ready"))
                    queued = await c.call(m.EnqueueOutbox(instance="t", chat="ops", replies=[m.Reply(text="alert")],
                                                          alert=True))
                    with pytest.raises(WriteRejected) as refused:  # not admitted: untried, answered at once
                        await c.call(m.EnqueueOutbox(instance="t", chat="c", replies=[m.Reply(text="reply")]))
                    with pytest.raises(WriteRejected) as inbound_refused:
                        await c.call(inbound(10_000), key="t:m:10000")
                    return queued, refused.value.code, inbound_refused.value.code

            queued, code, inbound_code = asyncio.run(essentials())
            assert queued.ids and code == "disk_full" and inbound_code == "disk_full"
            time.sleep(1.5)  # checkpoints every 0.2 s meet the full disk: not one may kill the writer
            assert writer.alive() and writer.pid == pid, writer.log_text()[-2000:]

            conn = db.open_reader(home.paths.db_file)
            wait_until(lambda: _writer_beat(conn).state == "disk_full", 5, what="the writer's beat to say disk_full")
            beat = _writer_beat(conn)
            assert "full" in beat.detail and str(data) in beat.detail
            with db.read_tx(conn):
                report = health.evaluate(home.paths, home.cfg, beat_store.all_beats(conn))
            assert report["status"] == "down"
            assert any("the data disk is full" in line for line in health.problems(report))

            free(data)
            wait_until(ballast.exists, 10, what="the reserve made again once space returned")
            wait_until(lambda: _writer_beat(conn).state == "ready", 5, what="the writer's beat to say ready")

            async def after():
                async with home.client("t", timeout_s=0.2, deadline_s=10) as c:
                    first = await c.call(inbound(10_000), key="t:m:10000")
                    again = await c.call(inbound(10_000), key="t:m:10000")
                    return first, again

            first, again = asyncio.run(after())
            assert not first.duplicate and again.duplicate and again.turn_id == first.turn_id
            with db.read_tx(conn):
                texts = [t.content for t in turn_store.user_turns_for_chat(conn, "t", "c")]
            assert [t.split(" x")[0] for t in texts[:stored_before]] == [f"message {n}" for n in range(stored_before)]
            assert texts.count("message 10000") == 1
            conn.close()
            assert writer.alive() and writer.pid == pid
            logged = writer.log_text()
            assert '"event":"disk_full"' in logged and '"event":"disk_space_back"' in logged
            assert "Traceback" not in logged
        finally:
            writer.stop()


async def _fill_and_write(home) -> tuple[int | None, int]:
    """Fill the disk, then write until the writer says disk_full: (the write refused, writes stored)."""
    async with home.client("t", timeout_s=0.2, deadline_s=10) as c:
        for n in range(5):
            await c.call(inbound(n), key=f"t:m:{n}")
        fill(home.paths.data_dir)
        stored = 5
        for n in range(5, 400):
            try:
                await c.call(inbound(n, f"message {n} " + "x" * 20_000), key=f"t:m:{n}")
            except WriteRejected as exc:
                assert exc.code == "disk_full", exc
                return n, stored
            stored += 1
        return None, stored


def _writer_beat(conn) -> beat_store.Beat:
    with db.read_tx(conn):
        return next(b for b in beat_store.all_beats(conn) if b.service == "writer")


class FullFor:
    """A writer client whose OutboxSent meets a full disk for ``seconds``; counts renewals meanwhile."""

    def __init__(self, client, seconds: float) -> None:
        self.client, self.until = client, time.monotonic() + seconds
        self.refused = self.renewed = 0

    def new_key(self) -> str:
        return self.client.new_key()

    async def call(self, op, key=None):
        if isinstance(op, m.RenewLease):
            self.renewed += 1
        if isinstance(op, m.OutboxSent) and time.monotonic() < self.until:
            self.refused += 1
            raise WriteRejected("disk_full", "the data disk is full")
        return await self.client.call(op, key=key)


def test_a_reply_sent_whose_report_cannot_be_stored_is_reported_later_and_never_sent_twice(monkeypatch):
    from types import SimpleNamespace

    from services.gateway.delivery import Deliverer, Outbound
    from common.stores import outbox_store

    monkeypatch.setattr(holding, "MAX_S", 0.3)
    lease_s = 1.0
    home = make_home()
    writer = start_writer(home)
    try:
        async def go():
            async with home.client("gw", timeout_s=0.2, deadline_s=10) as client:
                await client.call(m.EnqueueOutbox(instance="t", chat="c", replies=[m.Reply(text="the reply")]))
                item = (await client.call(m.ClaimOutbox(worker="gw@h", instances=["t"], lease_s=lease_s))).items[0]
                sends = []

                class Out(Outbound):
                    def render(self, body):
                        return [body]

                    async def send_text(self, item, index, text, last):
                        sends.append(item.id)
                        return "p1"

                async def no_placeholder(item):
                    return ""

                channel = SimpleNamespace(log=SimpleNamespace(bind=lambda **k: _Quiet()), outbound=Out)
                full = FullFor(client, seconds=3 * lease_s)  # the report waits three leases long
                gateway = SimpleNamespace(log=_Quiet(), worker="gw@h", channels={"t": channel},
                                          svc=SimpleNamespace(cfg=SimpleNamespace(gateways=SimpleNamespace(
                                              outbox_lease_s=lease_s))), rt=SimpleNamespace(client=full),
                                          drafts=SimpleNamespace(take=no_placeholder))
                delivering = asyncio.create_task(Deliverer(gateway)._deliver(item))
                taken_by_another = []
                while not delivering.done():  # meanwhile the row is never free for another gateway
                    other = await client.call(m.ClaimOutbox(worker="other@h", instances=["t"], lease_s=lease_s))
                    taken_by_another += other.items
                    await asyncio.sleep(0.1)
                return sends, full, taken_by_another

        sends, full, taken_by_another = asyncio.run(go())
        assert sends == [1] and taken_by_another == []  # sent once; its lease kept alive while it waited
        assert full.refused >= 3 and full.renewed >= 3
        conn = db.open_reader(home.paths.db_file)
        with db.read_tx(conn):
            rows = outbox_store.for_chat(conn, "t", "c")
        conn.close()
        assert [(r.state, r.platform_msg_id, r.attempts) for r in rows] == [("sent", "p1", 1)]
    finally:
        writer.stop()


class _Quiet:
    def __getattr__(self, name):
        return lambda *a, **k: None

    def bind(self, **kw):
        return self
