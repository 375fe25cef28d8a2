"""Streaming drafts: the writer relays a ShowDraft as an AnswerDraft (no commit, no ack, outside the gap
detection), and a runner whose turn's gateway instance streams publishes the answer so far, throttled, that a
plain zmq SUB on the writer's PUB receives; a streaming-off instance gets none and its model call is not streamed."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
import zmq

from common import bus, redact
from schema import messages as m
from services.runner.drafts import Drafts
from tests.procs import Proc, make_home, remove_home, start_writer
from tests.runner_stack import GATEWAY, KINDS, _collect, own_home, started

WORDS = " ".join(f"word{i}" for i in range(40))


class Sub:
    """A plain SUB socket on the writer's PUB, subscribed to one topic, checking each frame's MAC."""

    def __init__(self, home, topic: str) -> None:
        self.signer = bus.Signer(home.key)
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sock.connect(home.endpoints.events)

    def take(self, seconds: float, until=lambda event: False) -> list[tuple[float, m.AnswerDraft]]:
        """(time received, event) for what comes within ``seconds``, or up to the first event ``until`` accepts."""
        got = []
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self.sock.poll(int(left * 1000) + 1):
                break
            topic, tag, payload = self.sock.recv_multipart()
            assert self.signer.verify(tag, payload, topic)
            got.append((time.monotonic(), bus.decode(bus.event_decoder, payload)))
            if until(got[-1][1]):
                break
        return got

    def take_meanwhile(self, seconds: float, until) -> tuple[threading.Thread, list]:
        """``take`` in a thread of its own, so the times are those of arrival while the test does its part."""
        got: list = []
        thread = threading.Thread(target=lambda: got.extend(self.take(seconds, until)), daemon=True)
        thread.start()
        return thread, got

    def close(self) -> None:
        self.sock.close()


def draft(text: str, **kw) -> m.ShowDraft:
    return m.ShowDraft(instance="tg", chat="c1:77", thread="77", session_id=1, turn_id=2, text=text, **kw)


def test_the_writer_relays_drafts_uncommitted_unacked_and_outside_the_gap_detection() -> None:
    home = make_home("[bus]\nheartbeat_ivl_ms = 200\n")
    writer = start_writer(home)
    sub = Sub(home, m.topic_draft("tg"))
    beats = Sub(home, m.TOPIC_BEAT)

    async def go():
        async with home.client("runner") as client:
            subscriber = home.subscriber([m.topic_draft("tg")], beat_timeout_s=5)
            subscriber.start()
            await asyncio.sleep(0.3)  # the SUBs' subscriptions reach the writer
            assert all(client.send_hint(draft(f"text {i}", step=1)) for i in range(3))
            got = [await subscriber.next(2) for _ in range(4)]
            subscriber.close()
            stats = client.stats
            return got, stats.sent, stats.acked, client._pending

    try:
        got, sent, acked, pending = asyncio.run(go())
        received = sub.take(1.0)
        assert [d.text for _, d in received] == ["text 0", "text 1", "text 2"]
        first = received[0][1]
        assert isinstance(first, m.AnswerDraft) and (first.instance, first.chat, first.thread, first.session_id,
                                                      first.turn_id, first.step, first.done) == (
            "tg", "c1:77", "77", 1, 2, 1, False)
        assert [d.seq for _, d in received] == [1, 2, 3]
        assert sent == 0 and acked == 0 and not pending  # not a write: nothing waits for an ack
        # the subscriber that also follows the topic passes the drafts on and never resyncs for them
        drafts = [e for e in got if isinstance(e, m.AnswerDraft)]
        resyncs = [e.reason for e in got if isinstance(e, bus.Resync)]
        assert [d.text for d in drafts] == ["text 0", "text 1", "text 2"]
        assert resyncs == ["first contact with the writer"] or resyncs == []
        seqs = [e.seqs for _, e in beats.take(0.6) if isinstance(e, m.WriterBeat)]
        assert seqs and all(not any(t.startswith("draft/") for t in s) for s in seqs)
    finally:
        sub.close()
        beats.close()
        writer.stop()
        remove_home(home)


def _stack(home) -> None:
    """Writer and runner of the home."""
    started(home, Proc(home, "writer"))
    started(home, Proc(home, "runner"))


def _config(streaming: str):
    def edit(text: str) -> str:
        return text + f'\n[[gateways.telegram]]\nid = "{GATEWAY}"\nstreaming = "{streaming}"\n'
    return edit


async def _ask(home, chat: str, text: str) -> str:
    async with home.client("gateway") as c:
        await c.call(m.Inbound(agent="default", instance=GATEWAY, chat=chat, sender="u1", text=text,
                               dedupe_keys=[uuid.uuid4().hex]))
        got = await _collect(c, chat, 1, 20.0)
    return got[0] if got else ""


@pytest.mark.parametrize("kind", KINDS)
def test_the_runner_publishes_the_answer_so_far_throttled(kind: str) -> None:
    with own_home(_config("draft"), kind=kind) as home:
        _stack(home)
        home.fake.add({"text": "Looking.", "tool_call": {"name": "skill_load", "arguments": {"name": "x"}},
                       "pace": {"tokens": 2, "seconds": 0.1}},
                      {"text": WORDS, "pace": {"tokens": 40, "seconds": 2.0}})
        sub = Sub(home, m.topic_draft(GATEWAY))
        try:
            time.sleep(0.3)
            thread, received = sub.take_meanwhile(30, lambda d: d.done and d.text == WORDS)
            answer = asyncio.run(_ask(home, "C1:1700.5", "hello"))
            thread.join(5)
        finally:
            sub.close()
        assert answer == WORDS
        drafts = [d for _, d in received]
        assert {(d.instance, d.chat, d.thread) for d in drafts} == {(GATEWAY, "C1:1700.5", "1700.5")}
        assert len({d.turn_id for d in drafts}) == 1 and all(d.session_id > 0 for d in drafts)
        steps = sorted({d.step for d in drafts})
        assert len(steps) == 2 and steps[1] == steps[0] + 1  # the tool call started a new step
        first, last = [d for d in drafts if d.step == steps[0]], [(t, d) for t, d in received if d.step == steps[1]]
        assert first[-1].done and first[-1].text == "Looking."
        texts = [d.text for _, d in last]
        assert last[-1][1].done and texts[-1] == WORDS and not any(d.done for _, d in last[:-1])
        assert all(WORDS.startswith(t) for t in texts)
        # 40 pieces over 2 s: without the throttle ~40 drafts; at most one every 0.25 s, plus the done one
        assert 4 <= len(last) <= 2.0 / 0.25 + 3, texts
        gaps = [b[0] - a[0] for a, b in zip(last[:-2], last[1:-1])]
        assert all(g >= 0.2 for g in gaps), gaps  # (received times: the sends were 0.25 s apart at least)
        streamed = [r for r in home.fake.requests() if r.get("stream")]
        assert len(streamed) == 2


def test_a_streaming_off_instance_gets_no_draft_and_no_streamed_call() -> None:
    with own_home(_config("off")) as home:
        _stack(home)
        home.fake.add({"text": WORDS, "pace": {"tokens": 20, "seconds": 1.0}})
        sub = Sub(home, "draft/")
        try:
            time.sleep(0.3)
            answer = asyncio.run(_ask(home, "C2", "hello"))
            received = sub.take(0.5)
        finally:
            sub.close()
        assert answer == WORDS
        assert received == []
        requests = home.fake.requests()
        assert requests and all("stream" not in r["body"] for r in requests)


def test_drafts_are_throttled_redacted_and_closed_with_each_step() -> None:
    secret = "zq-" + uuid.uuid4().hex
    redact.register_secret(secret)
    claim = m.TurnClaim(turn_id=5, session_id=4, agent="default", instance="tg", chat="c:9", sender="u", text="",
                        attempt=1, lease_until=0.0)
    sent: list[tuple[float, m.ShowDraft]] = []

    async def go():
        drafts = Drafts(lambda op: sent.append((time.monotonic(), op)) or True, claim, every_s=0.1)
        drafts.begin_step(3)
        text = f"the key is {secret}:"
        started = time.monotonic()
        for i in range(50):  # 50 pieces over about 0.5 s (longer on a busy machine: measured)
            text += f" w{i}"
            drafts.on_text(text)
            await asyncio.sleep(0.01)
        writing_s = time.monotonic() - started
        drafts.close()
        drafts.end_step(text)
        await asyncio.sleep(0.25)  # nothing is left to go out after the step's end
        drafts.begin_step(4)
        drafts.end_step("")  # a step that wrote nothing (a tool call alone) sends nothing
        return text, writing_s

    final, writing_s = asyncio.run(go())
    ops = [op for _, op in sent]
    assert 4 <= len(ops) <= int(writing_s / 0.1) + 3, (len(ops), writing_s)  # one per 0.1 s, the first and the step's end: not 50
    gaps = [b[0] - a[0] for a, b in zip(sent[:-2], sent[1:-1])]
    assert all(g >= 0.09 for g in gaps), gaps
    assert ops[-1].done and not any(op.done for op in ops[:-1]) and {op.step for op in ops} == {3}
    assert all(secret not in op.text and redact.REDACTED in op.text for op in ops)
    assert ops[-1].text == final.replace(secret, redact.REDACTED)
    assert {(op.instance, op.chat, op.thread, op.session_id, op.turn_id) for op in ops} == {("tg", "c:9", "9", 4, 5)}
