"""Streamed model answers: each provider's SSE reader against the strict fakes (text, tool calls in pieces, usage,
a mid-stream error, a cut connection, an early end, each retried whole), the SSE decoder, the fakes' stream rules."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from common.config import Provider as ProviderConfig
from services.runner.llm import Message, ModelReply, ProviderError, ToolSpec
from services.runner.providers import make_provider
from services.runner.providers.sse import Decoder
from tests.fake_models import FakeModels, FakeModelsProcess

KINDS = ["openai", "anthropic"]
FAST = dict(max_attempts=3, backoff_s=0.01, max_wait_s=2.0, budget_s=5.0, timeout_s=5.0, connect_timeout_s=1.0)
READ_FILE = ToolSpec("read_file", "Read a file.", {"type": "object", "properties": {"path": {"type": "string"}}})
TEXT = "The quick brown fox jumps over the lazy dog, twice."


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 20))


def provider(kind: str, fake: FakeModels, **kw: Any):
    url = fake.openai_url if kind == "openai" else fake.anthropic_url
    cfg = ProviderConfig(kind=kind, base_url=url, api_key="none", model="fake-model")
    return make_provider("default", cfg, Path("/nonexistent/secrets.json"), **{**FAST, **kw})


async def ask(kind: str, steps: list[dict], stream: bool = True, tools=(READ_FILE,), **kw: Any):
    """(reply or ProviderError, every text on_text got, the requests the fake got)."""
    seen: list[str] = []
    async with FakeModels(steps, keyless=True) as fake:
        p = provider(kind, fake, **kw)
        try:
            reply: ModelReply | ProviderError = await p.complete(
                "You are terse.", [Message("user", "hi")], list(tools), on_text=seen.append if stream else None)
        except ProviderError as e:
            reply = e
        finally:
            await p.close()
        return reply, seen, fake.requests


@pytest.mark.parametrize("kind", KINDS)
def test_text_streams_and_the_reply_is_the_one_without_a_stream(kind: str) -> None:
    step = {"text": TEXT, "usage": {"input": 21, "output": 13}, "pace": {"tokens": 5, "seconds": 0.25}}
    reply, seen, requests = run(ask(kind, [step]))
    plain, none_seen, plain_requests = run(ask(kind, [{"text": TEXT, "usage": {"input": 21, "output": 13}}],
                                               stream=False))
    assert reply == plain  # text, usage, stop reason, model: the same ModelReply
    assert reply.text == TEXT and reply.usage.input_tokens == 21 and reply.usage.output_tokens == 13
    assert reply.stop_reason == ("stop" if kind == "openai" else "end_turn")
    assert len(seen) >= 3, seen  # paced: the text came in pieces, each call the whole text so far
    assert all(TEXT.startswith(t) for t in seen) and seen[-1] == TEXT
    assert all(len(a) < len(b) for a, b in zip(seen, seen[1:]))
    body = requests[0]["body"]
    assert body["stream"] is True and requests[0].get("stream") and "invalid" not in requests[0]
    assert requests[0]["headers"]["accept"] == "text/event-stream"
    if kind == "openai":
        assert body["stream_options"] == {"include_usage": True}
    assert "stream" not in plain_requests[0]["body"] and "stream_options" not in plain_requests[0]["body"]
    assert none_seen == []


@pytest.mark.parametrize("kind", KINDS)
def test_tool_calls_arrive_in_pieces(kind: str) -> None:
    calls = [{"name": "read_file", "arguments": {"path": "notes/a \"quoted\" name.txt", "n": 12345}, "id": "call_1"},
             {"name": "read_file", "arguments": {"path": "b.txt"}, "id": "call_2"}]
    reply, seen, _ = run(ask(kind, [{"text": "Let me look.", "tool_calls": calls}]))
    assert [(c.id, c.name, c.arguments) for c in reply.tool_calls] == [
        ("call_1", "read_file", {"path": "notes/a \"quoted\" name.txt", "n": 12345}),
        ("call_2", "read_file", {"path": "b.txt"})]
    assert reply.text == "Let me look." and seen[-1] == "Let me look."
    assert reply.stop_reason == ("tool_calls" if kind == "openai" else "tool_use")
    assert reply.usage.output_tokens > 0 and reply.usage.input_tokens > 0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["error", "cut", "truncate"])
def test_a_broken_stream_is_retried_whole(kind: str, how: str) -> None:
    steps = [{"text": "first try that breaks", "stream_break": how, "break_after": 2,
              "pace": {"tokens": 4, "seconds": 0.2}}, {"text": "second try"}]  # paced: the pieces come apart
    reply, seen, requests = run(ask(kind, steps))
    assert reply.text == "second try"
    assert len(requests) == 2
    assert "first try " in seen  # the draft of the broken try ...
    assert seen[-1] == "second try" and "second try".startswith(seen[seen.index("first try ") + 1])  # ... began again


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_that_keeps_breaking_fails_within_the_attempts(kind: str) -> None:
    steps = [{"text": "a b c", "stream_break": "error", "break_after": 1}] * 3
    reply, seen, requests = run(ask(kind, steps))
    assert isinstance(reply, ProviderError) and reply.kind == "server_error"
    assert len(requests) == 3  # max_attempts
    assert ("529" if kind == "anthropic" else "502") in reply.detail  # overloaded_error is Anthropic's 529


@pytest.mark.parametrize("kind", KINDS)
def test_errors_before_the_stream_are_classified_and_retried_as_before(kind: str) -> None:
    reply, _, requests = run(ask(kind, [{"status": 429, "retry_after": 0.1}, {"text": "fine"}]))
    assert reply.text == "fine" and len(requests) == 2
    reply, seen, requests = run(ask(kind, [{"status": 400, "message": "bad thing"}]))
    assert isinstance(reply, ProviderError) and reply.kind == "bad_request" and len(requests) == 1 and not seen


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_event_in_the_stream_is_the_error_it_names(kind: str) -> None:
    code = "rate_limit_error" if kind == "anthropic" else None
    steps = [{"text": "x y", "stream_break": "error", "break_after": 0, **({"code": code} if code else {})},
             {"text": "after"}]
    reply, _, requests = run(ask(kind, steps))
    assert reply.text == "after" and len(requests) == 2


def test_the_sse_decoder_takes_any_line_end_and_any_cut() -> None:
    stream = (b": a comment\r\nevent: one\r\ndata: a\r\ndata:b\r\n\r\n"
              b"data: {\"x\": 1}\n\nevent: two\rdata: z\r\rdata: [DONE]\n\n")
    for size in (1, 2, 3, 7, len(stream)):
        decoder = Decoder()
        events = [e for i in range(0, len(stream), size) for e in decoder.feed(stream[i:i + size])]
        assert [(e.name, e.data) for e in events] == [
            ("one", "a\nb"), ("message", '{"x": 1}'), ("two", "z"), ("message", "[DONE]")], size


async def _raw(api: str, body: dict) -> tuple[int, str, str]:
    async with FakeModels([{"text": "hi there"}], keyless=True) as fake:
        url = f"{fake.url}/v1/chat/completions" if api == "openai" else f"{fake.url}/v1/messages"
        headers = {"anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as resp:
            return resp.status, resp.content_type, await resp.text()


def test_the_fakes_stream_as_the_apis_do() -> None:
    openai = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    status, kind, text = run(_raw("openai", {**openai, "stream_options": {"include_usage": True}}))
    assert status == 400 and "only allowed when 'stream' is enabled" in text
    status, kind, text = run(_raw("openai", {**openai, "stream": True}))
    chunks = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert status == 200 and kind == "text/event-stream" and chunks[-1] == "[DONE]"
    assert all("usage" not in json.loads(c) for c in chunks[:-1])  # usage only when asked for
    status, kind, text = run(_raw("openai", {**openai, "stream": True, "stream_options": {"include_usage": True}}))
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])
    anthropic = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    status, kind, text = run(_raw("anthropic", {**anthropic, "stream": "yes"}))
    assert status == 400 and "stream: Input should be a valid boolean" in text
    status, kind, text = run(_raw("anthropic", {**anthropic, "stream": True}))
    names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
    assert status == 200 and kind == "text/event-stream"
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"]


def test_a_paced_fake_streams_its_tokens_over_its_seconds(tmp_path: Path) -> None:
    """As a bench asks for it: "200 tokens over 4 s", here 20 over 0.5 s, set on the fake process (--pace)."""
    fake = FakeModelsProcess(tmp_path / "fake", pace={"tokens": 20, "seconds": 0.5}, keyless=True).start()

    async def go(stream: bool):
        cfg = ProviderConfig(kind="openai", base_url=fake.openai_url, api_key="none", model="fake-model")
        p = make_provider("default", cfg, tmp_path / "secrets.json", **FAST)
        seen: list[tuple[float, str]] = []
        started = time.monotonic()
        try:
            reply = await p.complete("", [Message("user", "hi")], [],
                                     on_text=(lambda t: seen.append((time.monotonic(), t))) if stream else None)
        finally:
            await p.close()
        return reply, seen, started, time.monotonic()

    try:
        reply, seen, started, ended = run(go(True))
        assert reply.text.startswith("echo: hi") and len(reply.text.split()) == 20  # the echo, padded to the pace
        assert len(seen) >= 10 and seen[-1][1] == reply.text
        assert seen[0][0] - started < 0.2 and seen[-1][0] - seen[0][0] >= 0.35  # spread over the 0.5 s
        reply, seen, started, ended = run(go(False))
        assert reply.text.split()[:2] == ["echo:", "hi"] and ended - started >= 0.5 and not seen
        fake.set_pace(None)
        reply, _, started, ended = run(go(True))
        assert reply.text == "echo: hi" and ended - started < 0.5
    finally:
        fake.stop()
