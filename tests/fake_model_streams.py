"""The fake model servers' streamed answers (tests/fake_models.py): SSE as OpenAI and Anthropic send it, paced and broken on request.

OpenAI Chat Completions (`"stream": true`): `data: <chunk>` lines, each a `chat.completion.chunk` with one
choice: a first delta with the role, content pieces, for each tool call a delta with its index, id, type
and name (and "" arguments) then its arguments in pieces, a last choice with the finish_reason, then (only
with `stream_options.include_usage`, and then every chunk before it has `"usage": null`) a chunk with no
choices and the usage, then `data: [DONE]`.

Anthropic Messages (`"stream": true`): `event: <type>` + `data: <json>`: message_start (usage with the
input tokens), ping, content_block_start / content_block_delta (text_delta; input_json_delta with
partial_json pieces) / content_block_stop per block, message_delta (stop_reason, output usage),
message_stop.

A pace ({"tokens": 200, "seconds": 4}) cuts the text into at most `tokens` pieces and spreads them
evenly over `seconds`. A break ends the stream after `break_after` pieces of text: "cut" drops the
connection, "error" sends the API's mid-stream error (OpenAI: a chunk holding `error`; Anthropic: an
`event: error` with overloaded_error, or the step's "code"), "truncate" ends the stream cleanly but
before its last event.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from aiohttp import web

_WORD = re.compile(r"\s*\S+\s*|\s+")


def pieces(text: str, tokens: int = 0) -> list[str]:
    """The text as the pieces a model would stream: words (with their spaces), in at most ``tokens`` groups."""
    words = _WORD.findall(text) or ([text] if text else [])
    if tokens <= 0 or len(words) <= tokens:
        return words
    size = len(words) / tokens
    return ["".join(words[round(i * size):round((i + 1) * size)]) for i in range(tokens)]


class Pacer:
    """Waits between pieces so that ``count`` of them take ``seconds`` in all; cut short when the fake stops."""

    def __init__(self, pace: dict[str, Any] | None, count: int, closing: asyncio.Event) -> None:
        seconds = float((pace or {}).get("seconds", 0))
        self.interval = seconds / max(1, count) if seconds > 0 else 0.0
        self.closing = closing
        self.started = time.monotonic()
        self.sent = 0

    async def next(self) -> None:
        self.sent += 1
        if not self.interval:
            return
        wait = self.started + self.sent * self.interval - time.monotonic()
        if wait > 0:
            try:
                await asyncio.wait_for(self.closing.wait(), wait)
            except TimeoutError:
                pass


class _Out:
    """One streamed response, and the break the step asked for."""

    def __init__(self, request: web.Request, step: dict[str, Any]) -> None:
        self.request = request
        self.resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8",
                                                            "Cache-Control": "no-cache"})
        self.how = step.get("stream_break")
        self.after = int(step.get("break_after", 1))
        self.texts = 0

    async def start(self) -> None:
        await self.resp.prepare(self.request)

    async def send(self, data: Any, event: str = "") -> None:
        head = f"event: {event}\n" if event else ""
        body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        await self.resp.write(f"{head}data: {body}\n\n".encode())

    def breaks_now(self) -> bool:
        """Counts a piece of text; True when the stream is to break before it."""
        self.texts += 1
        return self.how is not None and self.texts > self.after

    async def end(self) -> web.StreamResponse:
        await self.resp.write_eof()
        return self.resp

    async def cut(self) -> web.StreamResponse:
        transport = self.request.transport
        if transport is not None:
            transport.abort()  # the client reads a body that stops short: its payload error
        return self.resp


async def stream_openai(request: web.Request, step: dict[str, Any], n: int, model: str, text: str | None,
                        calls: list[dict[str, Any]], n_in: int, n_out: int, stop: str | None, *,
                        include_usage: bool, pace: dict[str, Any] | None, closing: asyncio.Event
                        ) -> web.StreamResponse:
    out = _Out(request, step)
    await out.start()
    base = {"id": f"chatcmpl-fake-{n}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "system_fingerprint": "fp_fake"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        c = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        return {**c, "usage": None} if include_usage else c

    await out.send(chunk({"role": "assistant", "content": "", "refusal": None}))
    parts = pieces(text or "", int((pace or {}).get("tokens", 0)))
    pacer = Pacer(pace, len(parts), closing)
    for part in parts:
        if out.breaks_now():
            return await _break_openai(out, step)
        await out.send(chunk({"content": part}))
        await pacer.next()
    for i, c in enumerate(calls):
        args = c["arguments"] if isinstance(c.get("arguments"), str) else json.dumps(c.get("arguments") or {})
        first = {"index": i, "id": c.get("id") or f"call_fake_{n}_{i}", "type": "function",
                 "function": {"name": c["name"], "arguments": ""}}
        await out.send(chunk({"tool_calls": [first]}))
        for piece in _json_pieces(args):
            await out.send(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    if out.how is not None and out.texts <= out.after:  # a break asked for after the last piece of text
        return await _break_openai(out, step)
    await out.send(chunk({}, stop or ("tool_calls" if calls else "stop")))
    if include_usage:
        usage = {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}
        await out.send({**base, "choices": [], "usage": usage})
    await out.send("[DONE]")
    return await out.end()


async def _break_openai(out: _Out, step: dict[str, Any]) -> web.StreamResponse:
    if out.how == "cut":
        return await out.cut()
    if out.how == "error":
        await out.send({"error": {"message": step.get("message", "The server had an error while processing your"
                                                      " request. Sorry about that!"),
                                  "type": "server_error", "param": None, "code": step.get("code")}})
    return await out.end()


async def stream_anthropic(request: web.Request, step: dict[str, Any], n: int, model: str, text: str | None,
                           calls: list[dict[str, Any]], n_in: int, n_out: int, stop: str | None, *,
                           pace: dict[str, Any] | None, closing: asyncio.Event) -> web.StreamResponse:
    out = _Out(request, step)
    await out.start()
    message = {"id": f"msg_fake_{n}", "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": n_in, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                         "output_tokens": 1}}
    await out.send({"type": "message_start", "message": message}, "message_start")
    await out.send({"type": "ping"}, "ping")
    index = 0
    parts = pieces(text or "", int((pace or {}).get("tokens", 0)))
    if parts:
        await out.send({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                       "content_block_start")
        pacer = Pacer(pace, len(parts), closing)
        for part in parts:
            if out.breaks_now():
                return await _break_anthropic(out, step)
            await out.send({"type": "content_block_delta", "index": 0,
                            "delta": {"type": "text_delta", "text": part}}, "content_block_delta")
            await pacer.next()
        await out.send({"type": "content_block_stop", "index": 0}, "content_block_stop")
        index = 1
    for i, c in enumerate(calls, start=index):
        use = {"type": "tool_use", "id": c.get("id") or f"toolu_fake_{n}_{i - index}", "name": c["name"], "input": {}}
        await out.send({"type": "content_block_start", "index": i, "content_block": use}, "content_block_start")
        for piece in _json_pieces(json.dumps(c.get("arguments") or {})):
            await out.send({"type": "content_block_delta", "index": i,
                            "delta": {"type": "input_json_delta", "partial_json": piece}}, "content_block_delta")
        await out.send({"type": "content_block_stop", "index": i}, "content_block_stop")
    if out.how is not None and out.texts <= out.after:
        return await _break_anthropic(out, step)
    await out.send({"type": "message_delta", "delta": {"stop_reason": stop or ("tool_use" if calls else "end_turn"),
                                                       "stop_sequence": None},
                    "usage": {"output_tokens": n_out}}, "message_delta")
    await out.send({"type": "message_stop"}, "message_stop")
    return await out.end()


async def _break_anthropic(out: _Out, step: dict[str, Any]) -> web.StreamResponse:
    if out.how == "cut":
        return await out.cut()
    if out.how == "error":
        error = {"type": step.get("code") or "overloaded_error", "message": step.get("message", "Overloaded")}
        await out.send({"type": "error", "error": error}, "error")
    return await out.end()


def _json_pieces(text: str) -> list[str]:
    """JSON text in the uneven pieces the APIs send it in (a piece may end inside a string or a number)."""
    if len(text) <= 2:
        return [text]
    third = max(1, len(text) // 3)
    return [text[:third], text[third:2 * third], text[2 * third:]]
