"""Hostile frames on the bus: too deep, garbage, huge maps, over the size limit. Every receiver
(the writer, a writer client, an event subscriber) counts and drops them and goes on serving."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time

import msgspec
import pytest
import zmq
import zmq.asyncio

from common import bus
from common.errors import WriteRejected
from schema import messages as m
from services.writer.main import Writer
from tests.procs import make_home, remove_home, start_writer, wait_until

DEPTH = 100_000  # far past msgspec's recursion limit (it follows Python's, 1000 by default)
DEEP_ARRAY = b"\x91" * DEPTH + b"\xc0"  # [[[[...nil...]]]]
DEEP_MAP = b"\x81\xa1a" * DEPTH + b"\xc0"  # {"a": {"a": ...}}


def _map(*pairs: tuple[str, bytes]) -> bytes:
    """A msgpack map (up to 15 entries) of str keys and already-encoded values."""
    out = bytes([0x80 | len(pairs)])
    for key, value in pairs:
        out += msgspec.msgpack.encode(key) + value
    return out


def _enc(value: object) -> bytes:
    return msgspec.msgpack.encode(value)


# a valid tag and id, then a field that fails validation, then a payload nested too deep: the old
# refusal path decoded it whole again to find the id, and died of RecursionError
DEEP_AFTER_INVALID = _map(("type", _enc("Request")), ("id", _enc(7)), ("key", _enc(5)), ("op", DEEP_ARRAY))
# a valid tag and well-formed fields, and an unknown field nested too deep (skipping it recurses too)
DEEP_UNKNOWN_FIELD = _map(("type", _enc("Request")), ("id", _enc(8)), ("key", _enc("deep-unknown")),
                          ("op", _enc({"type": "Ping"})), ("zz", DEEP_ARRAY))
HUGE_MAP_HEADER = b"\xdf\xff\xff\xff\xff"  # a map that claims 2**32 - 1 entries and has none
HUGE_MAP = _map(("type", _enc("Request")), ("id", _enc(9)), ("key", _enc("huge-map")),
                ("op", _enc({"type": "Ping", "extra": {str(i): i for i in range(200_000)}})))

HOSTILE = {
    "deep after invalid": DEEP_AFTER_INVALID,
    "deep unknown field": DEEP_UNKNOWN_FIELD,
    "deep array": DEEP_ARRAY,
    "deep map": DEEP_MAP,
    "huge map header": HUGE_MAP_HEADER,
    "huge map of an unknown field": HUGE_MAP,
    "random bytes": random.Random(12).randbytes(4096),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_decode_turns_any_bytes_into_a_value_or_a_bad_frame(name):
    for decoder in (bus.request_decoder, bus.ack_decoder, bus.event_decoder):
        try:
            bus.decode(decoder, HOSTILE[name])
        except bus.BadFrame as exc:
            assert exc.reason in ("invalid", "undecodable", "too_deep", "too_large")
            assert len(exc.error) <= 300


# ---------------------------------------------------------------- the writer, a real process


@pytest.fixture(scope="module")
def writer():
    home = make_home()
    proc = start_writer(home)
    yield home, proc
    proc.stop()
    remove_home(home)


class RawPeer:
    """A DEALER that sends whatever it is given, signed with the home's key."""

    def __init__(self, home) -> None:
        self.key = home.key
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 5000)  # close() delivers what was sent
        self.sock.connect(home.endpoints.writer)

    def send_signed(self, payload: bytes) -> None:
        self.sock.send_multipart([bus.mac(self.key, payload), payload])

    def close(self) -> None:
        self.sock.close()


def _ping_and_write(home, chat: str) -> m.Accepted:
    async def go():
        async with home.client("hostile-check", timeout_s=0.3) as c:
            return await asyncio.wait_for(c.call(m.Inbound(
                agent="default", instance="test", chat=chat, sender="u1", text="still here",
                dedupe_keys=[f"hostile:{chat}"])), 15)

    return asyncio.run(go())


def _dropped(home) -> dict[str, int]:
    """The writer's latest drop count per reason, from its log."""
    counts: dict[str, int] = {}
    for line in (home.paths.logs_dir / "writer.log").read_text().splitlines():
        if '"event":"frame_dropped"' in line:
            event = json.loads(line)
            counts[event["reason"]] = max(counts.get(event["reason"], 0), event["count"])
    return counts


def test_the_writer_survives_every_hostile_frame_repeated_and_keeps_acking(writer):
    home, proc = writer
    peer = RawPeer(home)
    try:
        for _ in range(5):  # repeated, as a client resending it would: the old writer crash-looped
            for payload in HOSTILE.values():
                peer.send_signed(payload)
            peer.sock.send_multipart([random.Random(3).randbytes(64)])  # unsigned garbage, one part
    finally:
        peer.close()
    accepted = _ping_and_write(home, "after-hostile")
    assert proc.alive()
    assert isinstance(accepted, m.Accepted) and not accepted.duplicate
    wait_until(lambda: _dropped(home).get("too_deep", 0) >= 10, 10, what="too_deep drops in the log")
    dropped = _dropped(home)
    assert {"too_deep", "undecodable", "invalid", "malformed"} <= set(dropped), dropped
    assert "Traceback" not in proc.log_text()


def test_a_request_that_fails_validation_is_answered_at_once(writer):
    home, _proc = writer
    payload = _enc({"type": "Request", "id": 41, "key": "k", "op": {"type": "Inbound", "agent": 5}})
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(home.endpoints.writer)
    try:
        sock.send_multipart([bus.mac(home.key, payload), payload])
        assert sock.poll(5000, zmq.POLLIN)
        tag, answer = sock.recv_multipart()
    finally:
        sock.close()
    ack = bus.decode(bus.ack_decoder, answer)
    assert (True, 41, False, "invalid") == (bus.verify(home.key, tag, answer), ack.id, ack.ok, ack.code)


# ---------------------------------------------------------------- a writer client, against a fake writer


def test_a_writer_client_drops_hostile_acks_and_takes_the_real_one(tmp_path):
    key = bus.bus_key(b"hostile acks")
    endpoint = f"ipc://{tmp_path}/w.sock"
    ctx = zmq.asyncio.Context()

    async def fake_writer(router):
        ident, _tag, payload = await router.recv_multipart()
        req = bus.decode(bus.request_decoder, payload)
        for bad in (*HOSTILE.values(), _enc({"type": "Ack", "id": req.id, "ok": "yes"})):
            await router.send_multipart([ident, bus.mac(key, bad), bad])
        await router.send_multipart([ident, b"short"])  # one part too few
        good = bus.encode(m.Ack(id=req.id, ok=True, result=m.Done()))
        await router.send_multipart([ident, bus.mac(key, good), good])

    async def go():
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.bind(endpoint)
        serving = asyncio.create_task(fake_writer(router))
        try:
            async with bus.WriterClient(endpoint, key, name="hostile", timeout_s=30, ctx=ctx) as client:
                result = await asyncio.wait_for(client.call(m.Ping()), 15)
                return result, dict(client.drops.counts), client.stats.dropped_frames
        finally:
            serving.cancel()
            router.close()

    try:
        result, counts, dropped = asyncio.run(go())
    finally:
        ctx.term()
    assert m.Done() == result
    assert dropped == len(HOSTILE) + 2
    assert {"too_deep", "invalid", "malformed"} <= set(counts), counts


# ---------------------------------------------------------------- an event subscriber, fed frames


def test_an_event_subscriber_drops_hostile_events_and_takes_the_next_one():
    key = bus.bus_key(b"hostile events")
    sub = bus.EventSubscriber("ipc:///nonexistent", key, [m.TOPIC_TURN])
    signer = bus.Signer(key)
    topic = m.TOPIC_TURN.encode()
    for bad in HOSTILE.values():
        assert sub._accept([topic, signer.mac(bad, topic), bad]) is None
    assert sub._accept([b"\xff\xfe", signer.mac(b"x", b"\xff\xfe"), b"x"]) is None
    good = bus.encode(m.TurnPending(epoch="e1", seq=1, session_id=1, turn_id=1))
    outcome = sub._accept([topic, signer.mac(good, topic), good])
    assert bus.Resync("first contact with the writer") == outcome
    assert len(HOSTILE) + 1 == sub.stats.dropped_frames
    assert {"too_deep", "invalid", "undecodable"} <= set(sub.drops.counts), sub.drops.counts


# ---------------------------------------------------------------- frames over the size limit


def _peak_rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/PID/status")


def test_a_frame_over_the_limit_is_refused_unread_and_the_writer_keeps_serving(writer):
    home, proc = writer
    _ping_and_write(home, "before-big")
    before = _peak_rss_kb(proc.pid)
    huge = b"\0" * (3 * bus.MAX_FRAME_BYTES)  # 96 MB: a writer that read it would peak far above `before`
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.connect(home.endpoints.writer)
    try:
        sock.send_multipart([bus.mac(home.key, huge), huge])
        # the writer cuts the connection at the frame's header: that is the refusal
        assert monitor.poll(10_000, zmq.POLLIN), "the writer did not cut the connection"
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()
    del huge
    accepted = _ping_and_write(home, "after-big")
    assert proc.alive() and not accepted.duplicate
    grown_mb = (_peak_rss_kb(proc.pid) - before) / 1024
    assert grown_mb < 16, f"the writer's peak RSS grew by {grown_mb:.0f} MB"


def test_a_request_over_the_limit_fails_at_once_in_the_client(writer):
    home, _proc = writer
    op = m.Inbound(agent="default", instance="test", chat="too-big", sender="u1", dedupe_keys=["too-big:1"],
                   text="x" * (bus.MAX_FRAME_BYTES + 1))

    async def go():
        async with home.client("big", timeout_s=0.3, deadline_s=30) as c:
            started = time.monotonic()
            with pytest.raises(WriteRejected) as caught:
                await c.call(op)
            return caught.value.code, time.monotonic() - started

    code, took = asyncio.run(go())
    assert "too_large" == code and took < 1


class _AckSink:
    """What Writer._send_bundle needs of a writer: where frames go and where drops are counted."""

    _send_bundle = Writer._send_bundle

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self._drop = bus.Drops()

    def _send_raw(self, _ident: bytes, payload: bytes) -> None:
        self.frames.append(payload)


def test_acks_are_bundled_in_frames_under_the_limit_and_an_answer_too_large_becomes_an_error(monkeypatch):
    monkeypatch.setattr(bus, "MAX_FRAME_BYTES", 4096)
    claim = m.TurnClaim(turn_id=1, session_id=1, agent="a", instance="i", chat="c", sender="s", text="t" * 1000,
                        attempt=1, lease_until=0.0)
    bundle = [m.Ack(id=i, ok=True, result=claim) for i in range(1, 21)]
    bundle.append(m.Ack(id=99, ok=True, result=msgspec.structs.replace(claim, text="t" * 10_000)))
    sink = _AckSink()
    sink._send_bundle(b"client", bundle)
    acks = []
    for frame in sink.frames:
        assert len(frame) <= 4096
        decoded = bus.decode(bus.ack_decoder, frame)
        acks.extend(decoded.acks if isinstance(decoded, m.Acks) else [decoded])
    assert list(range(1, 21)) + [99] == [a.id for a in acks]
    assert (False, "too_large") == (acks[-1].ok, acks[-1].code)
    assert 1 == sink._drop.counts["ack_too_large"]
