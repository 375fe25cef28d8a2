"""Garbage and valid-but-wrong requests on the writer's socket: dropped or refused, never fatal."""

from __future__ import annotations

import asyncio
import json

import msgspec
import zmq
from hypothesis import HealthCheck, given, settings, strategies as st

from common import bus
from common.errors import WriteRejected
from schema import messages as m

raw_frames = st.lists(st.binary(max_size=300), min_size=1, max_size=4)

wrong_ops = st.one_of(
    st.builds(m.FinishTurn, turn_id=st.integers(-(2**63), 2**64 - 1), worker=st.text(max_size=20)),
    st.builds(m.OutboxSent, id=st.integers(-(2**63), 2**64 - 1), worker=st.text(max_size=20)),
    st.builds(m.RenewLease, kind=st.text(max_size=10), id=st.integers(-5, 10**6), worker=st.text(max_size=5),
              lease_s=st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(m.ClaimTurn, worker=st.text(max_size=5), lease_s=st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(m.AppendTurn, session_id=st.integers(-5, 10**6), worker=st.text(max_size=5), role=st.text(max_size=10),
              content=st.text(max_size=50)),
    st.builds(m.Inbound, agent=st.text(max_size=10), instance=st.text(max_size=10), chat=st.text(max_size=10),
              sender=st.text(max_size=10), dedupe_keys=st.lists(st.text(max_size=10), max_size=2),
              text=st.text(max_size=200)),
    st.builds(m.EnqueueOutbox, instance=st.text(max_size=5), chat=st.text(max_size=5),
              replies=st.lists(st.builds(m.Reply, text=st.text(max_size=10)), max_size=2),
              session_id=st.integers(-5, 10**6)),
    st.builds(m.Checkpoint, mode=st.text(max_size=10)),
    st.builds(m.ReleaseOutbox, ids=st.lists(st.integers(-5, 10**6), max_size=3), worker=st.text(max_size=5)),
    st.builds(m.ParkTurn, turn_id=st.integers(-5, 10**6), worker=st.text(max_size=5), approval_id=st.text(max_size=8),
              tool=st.text(max_size=8), ttl_s=st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(m.DecideApproval, approval_id=st.text(max_size=8), approve=st.booleans(), decided_by=st.text(max_size=5),
              always=st.booleans()),
    st.builds(m.CronAdd, name=st.text(max_size=8), prompt=st.text(max_size=20), agent=st.text(max_size=5),
              deliver_instance=st.text(max_size=5), deliver_chat=st.text(max_size=5), schedule=st.text(max_size=10),
              run_at=st.floats(allow_nan=True, allow_infinity=True)),
    st.builds(m.CronRemove, name=st.text(max_size=8)),
    st.builds(m.JobEnded, job_id=st.integers(-(2**63), 2**64 - 1), state=st.text(max_size=8)),
    st.builds(m.SetSummary, session_id=st.integers(-5, 10**6), summary=st.text(max_size=20),
              upto_turn_id=st.integers(-(2**63), 2**64 - 1)),
    st.builds(m.CloseSession, session_id=st.integers(-(2**63), 2**64 - 1)),
    st.builds(m.RequestPairing, instance=st.text(max_size=5), sender=st.text(max_size=5), chat=st.text(max_size=5)),
    st.builds(m.ApprovePairing, code=st.text(max_size=10), approved_by=st.text(max_size=5)),
    st.builds(m.RecordUsage, session_id=st.integers(-5, 10**6), turn_id=st.integers(-5, 10**6), agent=st.text(max_size=5),
              provider=st.text(max_size=5), model=st.text(max_size=5), input_tokens=st.integers(-(2**63), 2**64 - 1),
              cost_usd=st.floats(allow_nan=True, allow_infinity=True)),
)


class RawPeer:
    """A DEALER that can send anything, signed or not."""

    def __init__(self, home) -> None:
        self.key = home.key
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 5000)  # close() delivers what was sent: the writer must see it
        self.sock.connect(home.endpoints.writer)

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def signed(self, payload: bytes) -> list[bytes]:
        return [bus.mac(self.key, payload), payload]

    def close(self) -> None:
        self.sock.close()


def ping(home) -> bool:
    async def go():
        async with home.client("fuzz-check", timeout_s=0.3) as c:
            return await c.ping(10)

    return asyncio.run(go())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=raw_frames)
def test_unsigned_garbage_is_dropped(writer_home, frames):
    peer = RawPeer(writer_home)
    try:
        peer.send(frames)
    finally:
        peer.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=500))
def test_signed_garbage_is_dropped(writer_home, payload):
    peer = RawPeer(writer_home)
    try:
        peer.send(peer.signed(payload))
    finally:
        peer.close()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(op=wrong_ops)
def test_valid_but_wrong_requests_get_an_answer(writer_home, op):
    async def go():
        async with writer_home.client("fuzz", timeout_s=0.5) as c:
            try:
                return await asyncio.wait_for(c.call(op), 10)
            except WriteRejected as exc:
                return exc

    answer = asyncio.run(go())
    assert isinstance(answer, (WriteRejected, *m.Result.__args__))


def test_wrong_shape_for_a_known_tag_is_dropped_and_the_writer_answers_next(writer_home):
    peer = RawPeer(writer_home)
    try:
        peer.send(peer.signed(msgspec.msgpack.encode({"type": "Request", "id": "x", "key": 5, "op": {"type": "Ping"}})))
        peer.send(peer.signed(msgspec.msgpack.encode({"type": "Nope"})))
        peer.send([b"only one part"])
        peer.send([b"x" * 16, b"y", b"z", b"w"])
    finally:
        peer.close()
    assert ping(writer_home)


def test_the_writer_survives_the_fuzzing_and_counts_what_it_dropped(writer_home):
    assert ping(writer_home)
    log = (writer_home.paths.logs_dir / "writer.log").read_text()
    reasons = {json.loads(line).get("reason") for line in log.splitlines() if '"event":"frame_dropped"' in line}
    assert {"unauthenticated", "undecodable", "malformed"} <= reasons, reasons
    assert writer_home.key.hex() not in log
