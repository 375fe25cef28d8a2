"""The gateway spool (services/gateway/spool.py): an event is durable before it is acknowledged (stored, or
appended and fsynced), spooled events are handed on in order and replayed after a restart, a
redelivery is not spooled twice, the file stays bounded and is emptied once everything is stored."""

from __future__ import annotations

import asyncio
import json
import os

from common.held_files import spool_sizes
from services.gateway import spool as sp
from services.gateway.spool import Spool


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def _add(self, event, **kw):
        self.events.append((event, kw))

    info = warning = error = debug = _add

    def names(self) -> list[str]:
        return [e for e, _ in self.events]


def make(tmp_path, **kw) -> tuple[Spool, Log]:
    log = Log()
    s = Spool(tmp_path / "spool" / "gw.spool", log, **kw)
    s.open()
    s.replay("a", lambda event: None)  # nothing to replay: the instance takes events from now on
    return s, log


def lines(s: Spool) -> list[dict]:
    return [json.loads(line) for line in s.path.read_bytes().splitlines() if line.strip()]


def test_an_event_the_writer_stores_at_once_is_never_written(tmp_path):
    async def go():
        s, _ = make(tmp_path)
        stored = []

        async def handle():
            stored.append(1)

        assert await s.take("a", "k1", {"n": 1}, handle)
        await asyncio.sleep(0)
        return s, stored

    s, stored = asyncio.run(go())
    assert stored == [1] and s.path.stat().st_size == 0 and s.stats() == (0, 0)


def test_an_event_the_writer_does_not_store_in_time_is_fsynced_before_take_returns(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(sp.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))

    async def go():
        s, log = make(tmp_path, direct_s=0.05)
        writer_back = asyncio.Event()
        order = []

        def handler(n):
            async def handle():
                await writer_back.wait()
                order.append(n)
            return handle

        assert await s.take("a", "k1", {"n": 1}, handler(1))
        on_disk = [row["event"]["n"] for row in lines(s) if "seq" in row]
        assert on_disk == [1] and synced  # in the file, synced, before take returned
        # the next one is spooled at once: the writer is away (others already wait)
        assert await s.take("a", "k2", {"n": 2}, handler(2))
        assert [row["event"]["n"] for row in lines(s) if "seq" in row] == [1, 2]
        writer_back.set()
        for _ in range(100):
            if not s.spooled:
                break
            await asyncio.sleep(0.01)
        return s, order, log

    s, order, log = asyncio.run(go())
    assert order == [1, 2]
    assert s.path.stat().st_size == 0  # everything stored: the file starts again
    assert "spooling" in log.names() and "spool_drained" in log.names()


def test_what_a_killed_process_spooled_is_replayed_in_order_and_only_that(tmp_path):
    async def first():
        s, _ = make(tmp_path, direct_s=0.01)
        never = asyncio.Event()

        async def handle():
            await never.wait()  # the writer never comes back in this process's life

        for n in range(3):
            assert await s.take("a", f"k{n}", {"n": n}, handle)
        s.replay("b", lambda event: None)
        assert await s.take("b", "kb", {"n": "b"}, handle)  # another instance's: not replayed for "a"
        await s.close()

    asyncio.run(first())
    with open(tmp_path / "spool" / "gw.spool", "ab") as f:
        f.write(b'{"seq": 99, "instance": "a", "ev')  # a torn append: the crash came mid-write

    async def second():
        s = Spool(tmp_path / "spool" / "gw.spool", Log())
        s.open()
        handed = []
        count = s.replay("a", lambda event: lambda: _record(handed, event))
        for _ in range(100):
            if len(handed) == 3:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        return count, handed, s

    count, handed, s = asyncio.run(second())
    assert count == 3 and [e["n"] for e in handed] == [0, 1, 2]
    assert s.pending_instances() == {"b"}  # kept until "b" is served again


async def _record(into: list, event: dict) -> None:
    into.append(event)


def test_a_redelivery_of_an_event_held_here_is_not_spooled_twice(tmp_path):
    async def go():
        s, _ = make(tmp_path, direct_s=0.01)
        back = asyncio.Event()
        calls = []

        async def handle():
            calls.append(1)
            await back.wait()

        assert await s.take("a", "same", {"n": 1}, handle)
        assert await s.take("a", "same", {"n": 1}, handle)  # Slack sent it again before the first ack
        back.set()
        await asyncio.sleep(0.05)
        return s, calls

    s, calls = asyncio.run(go())
    assert calls == [1]


def test_a_full_spool_does_not_acknowledge_and_compacts_what_is_stored(tmp_path):
    async def go():
        s, log = make(tmp_path, direct_s=0.01, max_bytes=600)
        gates = {n: asyncio.Event() for n in range(10)}

        def handler(n):
            async def handle():
                await gates[n].wait()
            return handle

        results = [await s.take("a", f"k{n}", {"n": n, "pad": "x" * 100}, handler(n)) for n in range(6)]
        return s, log, results, gates

    s, log, results, gates = asyncio.run(go())
    assert results[:3] == [True, True, True] and False in results  # past the bound: not acknowledged
    assert "spool_full" in log.names()
    assert s.path.stat().st_size <= 600


def test_sizes_counts_what_is_not_yet_stored(tmp_path):
    async def go():
        s, _ = make(tmp_path, direct_s=0.01)
        never = asyncio.Event()

        async def handle():
            await never.wait()

        for n in range(2):
            await s.take("a", f"k{n}", {"n": n}, handle)
        await s.close()

    asyncio.run(go())
    found = spool_sizes(tmp_path / "spool")
    assert list(found) == ["gw"] and found["gw"][0] == 2 and found["gw"][1] > 0


def test_a_spool_that_cannot_be_made_acknowledges_only_what_is_stored(tmp_path):
    (tmp_path / "spool").write_text("in the way")  # its folder cannot be made (as on a disk full at start)

    async def go():
        log = Log()
        s = Spool(tmp_path / "spool" / "gw.spool", log, direct_s=0.05)
        s.open()
        s.replay("a", lambda event: None)
        back = asyncio.Event()

        async def slow():
            await back.wait()

        async def quick():
            pass

        results = [await s.take("a", "k1", {"n": 1}, quick), await s.take("a", "k2", {"n": 2}, slow)]
        back.set()
        await asyncio.sleep(0.05)
        return results, log

    results, log = asyncio.run(go())
    assert results == [True, False]  # stored: acknowledged; not stored in time and not spooled: not
    assert "spool_unavailable" in log.names() and "spool_write_failed" in log.names()
