"""Several requests in one frame (``Requests``): a client sends the calls of one event-loop turn together and
resends alone; the writer applies each as if it came alone, refuses only a bad one, keeps batch_max."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import zmq
import zmq.asyncio

from common import bus
from common.errors import WriteRejected
from schema import messages as m
from tests.procs import make_home, remove_home, start_writer

KEY = b"k" * 32


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


class FakeWriter:
    """A ROUTER that records the frames a client sends and answers what it is told to."""

    def __init__(self) -> None:
        self.sock = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.signer = bus.Signer(KEY)

    async def frame(self, timeout: float = 5.0) -> tuple[bytes, m.Request | m.Requests]:
        ident, tag, payload = await asyncio.wait_for(self.sock.recv_multipart(), timeout)
        assert self.signer.verify(tag, payload)
        return ident, bus.request_decoder.decode(payload)

    async def quiet(self, seconds: float) -> bool:
        return not await self.sock.poll(int(seconds * 1000))

    async def answer(self, ident: bytes, requests: list[m.Request]) -> None:
        payload = bus.encode(m.Acks(acks=[m.Ack(id=r.id, ok=True, result=m.Done()) for r in requests]))
        await self.sock.send_multipart([ident, self.signer.mac(payload), payload])

    def close(self) -> None:
        self.sock.close(linger=0)


def test_the_calls_of_one_turn_go_out_in_one_frame_in_order():
    async def go():
        fake = FakeWriter()
        try:
            async with bus.WriterClient(fake.endpoint, KEY, name="t", timeout_s=5.0) as client:
                await asyncio.sleep(0.1)  # connected
                calls = asyncio.gather(*(client.call(m.Heartbeat(service=f"s{i}", pid=i)) for i in range(10)))
                ident, frame = await fake.frame()
                quiet = await fake.quiet(0.2)
                await fake.answer(ident, frame.requests)
                return frame, quiet, await calls
        finally:
            fake.close()

    frame, quiet, results = run(go())
    assert isinstance(frame, m.Requests) and quiet
    assert [f"s{i}" for i in range(10)] == [r.op.service for r in frame.requests]
    assert len({r.id for r in frame.requests}) == len({r.key for r in frame.requests}) == 10
    assert [m.Done()] * 10 == results


def test_a_lone_call_goes_as_a_request_and_an_unanswered_frame_is_resent_one_by_one():
    async def go():
        fake = FakeWriter()
        try:
            async with bus.WriterClient(fake.endpoint, KEY, name="t", timeout_s=0.3) as client:
                await asyncio.sleep(0.1)
                lone = asyncio.ensure_future(client.call(m.Ping()))
                _, first = await fake.frame()
                await asyncio.sleep(0)
                calls = asyncio.gather(*(client.call(m.Heartbeat(service=f"s{i}", pid=i)) for i in range(3)))
                _, together = await fake.frame()
                resent = []
                while len(resent) < 4:  # no ack: after timeout_s each comes again on its own
                    resent.append(await fake.frame())
                for ident, request in resent:
                    await fake.answer(ident, [request])
                return first, together, [r for _, r in resent], await lone, await calls, client.stats.resent
        finally:
            fake.close()

    first, together, resent, lone, results, resent_count = run(go())
    assert isinstance(first, m.Request) and isinstance(together, m.Requests)
    assert [type(r) for r in resent] == [m.Request] * 4
    assert {first.key, *(r.key for r in together.requests)} == {r.key for r in resent}
    assert (m.Done(), [m.Done()] * 3, 4) == (lone, results, resent_count)


def _request(request_id: int, op: dict) -> dict:
    return {"type": "Request", "id": request_id, "key": f"frames-test:{request_id}", "op": op}


def test_a_bad_request_in_a_frame_is_refused_alone_and_the_others_applied(writer_home):
    inbound = {"type": "Inbound", "agent": "default", "instance": "test", "chat": "frames", "sender": "u1"}
    payload = msgspec.msgpack.encode({"type": "Requests", "requests": [
        _request(1, {**inbound, "text": "one", "dedupe_keys": ["frames:1"]}),
        _request(2, {"type": "CloseSession", "session_id": 2**64 - 1}),  # over SQLite's 64 bits: invalid
        _request(3, {**inbound, "text": "three", "dedupe_keys": ["frames:3"]}),
    ]})
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(writer_home.endpoints.writer)
    try:
        sock.send_multipart([bus.mac(writer_home.key, payload), payload])
        acks: dict[int, m.Ack] = {}
        while len(acks) < 3:
            assert sock.poll(10_000), f"acks so far: {acks}"
            _tag, body = sock.recv_multipart()
            frame = bus.ack_decoder.decode(body)
            acks.update((a.id, a) for a in (frame.acks if isinstance(frame, m.Acks) else [frame]))
    finally:
        sock.close()
    assert (True, False, True) == (acks[1].ok, acks[2].ok, acks[3].ok)
    assert "invalid" == acks[2].code
    assert acks[1].result.session_id == acks[3].result.session_id
    assert acks[1].result.turn_id < acks[3].result.turn_id


@pytest.fixture
def small_batches():
    home = make_home("[writer]\nbatch_max = 4\n")
    proc = start_writer(home)
    yield home
    proc.stop()
    remove_home(home)


def test_a_frame_larger_than_batch_max_is_applied_in_order_over_several_commits(small_batches):
    async def go():
        async with small_batches.client("frames", timeout_s=5.0) as client:
            ops = [m.Inbound(agent="default", instance="test", chat="big", sender="u1", text=f"#{i}",
                             dedupe_keys=[f"big:{i}"]) for i in range(11)]
            ops.insert(5, m.FinishTurn(turn_id=10**9, worker="nobody"))
            return await client.call_many(ops)

    results = run(go())
    refused = [r for r in results if isinstance(r, WriteRejected)]
    turn_ids = [r.turn_id for r in results if isinstance(r, m.Accepted)]
    assert (1, "not_found") == (len(refused), refused[0].code)
    assert isinstance(results[5], WriteRejected)
    assert 11 == len(turn_ids) and turn_ids == sorted(turn_ids)


def test_a_client_cuts_its_frames_by_count_and_by_size():
    def queued(count: int, size: int) -> list:
        return [bus._Pending(None, b"x" * size, 0.0, 0.0) for _ in range(count)]

    assert [bus.REQUESTS_PER_FRAME, 3] == [len(c) for c in bus._frame_chunks(queued(bus.REQUESTS_PER_FRAME + 3, 10))]
    assert [2, 2, 1] == [len(c) for c in bus._frame_chunks(queued(5, bus.MAX_FRAME_BYTES // 3))]
