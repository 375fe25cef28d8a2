"""Frame authentication and the subscriber's sequence bookkeeping, without a writer where none is needed."""

from __future__ import annotations

import asyncio
import time

import zmq

from common import bus, db
from common.stores import keys_store
from schema import messages as m


def test_a_request_signed_with_another_key_is_not_applied_nor_answered(writer_home):
    stranger_key = bus.bus_key(b"not the session secret")
    op = m.Inbound(agent="default", instance="test", chat="forged", sender="x", text="forged",
                   dedupe_keys=["forged:1"])
    payload = bus.encode(m.Request(id=1, key="forged-request", op=op))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(writer_home.endpoints.writer)
    try:
        sock.send_multipart([bus.mac(stranger_key, payload), payload])
        answered = sock.poll(1500, zmq.POLLIN)
    finally:
        sock.close()

    async def ping():
        async with writer_home.client() as c:
            return await c.ping(10)

    assert asyncio.run(ping())  # processed after the forged frame, so the forged one had its turn
    conn = db.open_reader(writer_home.paths.db_file)
    assert (0, None) == (answered, keys_store.inbound_turn(conn, ["forged:1"]))


def test_mac_depends_on_topic_and_payload():
    key = bus.bus_key(b"secret")
    tag = bus.mac(key, b"payload", b"turn/")
    assert (True, False, False) == (
        bus.verify(key, tag, b"payload", b"turn/"),
        bus.verify(key, tag, b"payload", b"outbox/x/"),
        bus.verify(key, tag, b"payload!", b"turn/"),
    )


class FakeSubscriber(bus.EventSubscriber):
    """The subscriber's frame handling, fed frames directly (no socket)."""

    def __init__(self, topics):
        super().__init__("ipc:///nonexistent", bus.bus_key(b"k"), topics)

    def feed(self, topic: str, event) -> object:
        payload = bus.encode(event)
        raw = topic.encode()
        self._last_heard = time.monotonic()
        return self._accept([raw, self._signer.mac(payload, raw), payload])


def turn(epoch: str, seq: int) -> m.TurnPending:
    return m.TurnPending(epoch=epoch, seq=seq, session_id=1, turn_id=seq)


def test_first_contact_then_consecutive_events_pass_through():
    sub = FakeSubscriber([m.TOPIC_TURN])
    first = sub.feed(m.TOPIC_TURN, turn("e1", 5))
    second = sub.feed(m.TOPIC_TURN, turn("e1", 6))
    assert (bus.Resync("first contact with the writer"), turn("e1", 6)) == (first, second)


def test_a_sequence_gap_asks_for_a_reread():
    sub = FakeSubscriber([m.TOPIC_TURN])
    sub.feed(m.TOPIC_TURN, turn("e1", 1))
    assert bus.Resync("sequence gap on turn/: expected 2, got 4") == sub.feed(m.TOPIC_TURN, turn("e1", 4))


def test_a_new_epoch_means_the_writer_restarted():
    sub = FakeSubscriber([m.TOPIC_TURN])
    sub.feed(m.TOPIC_TURN, turn("e1", 1))
    assert bus.Resync("the writer restarted") == sub.feed(m.TOPIC_TURN, turn("e2", 1))


def test_a_beat_showing_a_lost_tail_asks_for_a_reread():
    sub = FakeSubscriber([m.TOPIC_TURN])
    sub.feed(m.TOPIC_TURN, turn("e1", 1))
    beat = m.WriterBeat(epoch="e1", seq=9, schema_version=1, seqs={m.TOPIC_TURN: 3})
    quiet = m.WriterBeat(epoch="e1", seq=10, schema_version=1, seqs={m.TOPIC_TURN: 3})
    assert (bus.Resync("missed events on turn/"), None) == (sub.feed(m.TOPIC_BEAT, beat), sub.feed(m.TOPIC_BEAT, quiet))


def test_a_frame_with_a_bad_mac_is_dropped_and_counted():
    sub = FakeSubscriber([m.TOPIC_TURN])
    payload = bus.encode(turn("e1", 1))
    outcome = sub._accept([b"turn/", b"0" * bus.MAC_BYTES, payload])
    assert (None, 1) == (outcome, sub.stats.dropped_frames)


def test_bus_key_is_rfc5869_hkdf_sha256():
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    secret = b"a session secret of some length"
    expected = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"starling bus v1").derive(secret)
    assert expected == bus.bus_key(secret)
