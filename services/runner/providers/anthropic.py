"""Anthropic Messages API (`POST .../v1/messages`, `x-api-key`, `anthropic-version: 2023-06-01`).

base_url may end in `/v1` or not: config's default is `https://api.anthropic.com`, and both
`https://api.anthropic.com` and `https://api.anthropic.com/v1` reach `/v1/messages`.

The API wants user and assistant turns to alternate, with tool results in a user turn right after the
assistant turn that called the tools; so tool results become `tool_result` blocks, consecutive messages of
one role are merged into one (tool results first, as the API requires), empty and whitespace-only text is
dropped (the API refuses both; a user message left without text says so, so that the conversation still
ends with the person's turn), a history that starts with the assistant gets a short user turn in front,
tool calls and results become plain text in a request without tools (the API refuses tool blocks there),
and tool-call ids are reduced to the characters the API accepts ([A-Za-z0-9_-]), the same way on both
sides, so a history made with another provider still pairs up.

Streamed (`stream: true`): message_start (the model, input usage), content_block_start / _delta / _stop per
block (text_delta pieces of text; a tool_use's input as input_json_delta pieces of JSON text, parsed at its
stop), message_delta (stop_reason, the usage so far: its counts replace message_start's), message_stop;
ping and event types this reader does not know are skipped, as the API asks; an `error` event (such as
overloaded_error mid-stream) is that error.
"""

from __future__ import annotations

import json
import re
from typing import Any

from services.runner.llm import Message, ModelReply, ToolCall, ToolSpec, Usage
from services.runner.providers import sse
from services.runner.providers.base import Malformed, Provider

API_VERSION = "2023-06-01"
HISTORY_CUT = "(earlier conversation omitted)"
EMPTY_MESSAGE = "(a message without text)"
_BAD_ID_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# the HTTP status an error event stands for, by its type (the API's error types)
ERROR_STATUS = {
    "invalid_request_error": 400, "authentication_error": 401, "billing_error": 402, "permission_error": 403,
    "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
    "timeout_error": 504, "overloaded_error": 529,
}
_INPUT_USAGE = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _id(call_id: str) -> str:
    return _BAD_ID_CHARS.sub("_", call_id) or "toolu_unknown"


def _blocks(m: Message) -> tuple[str, list[dict[str, Any]]]:
    """(role, content blocks) of one neutral message."""
    if m.role == "tool":
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": _id(m.tool_call_id)}
        if m.content:
            block["content"] = m.content
        return "user", [block]
    # the API refuses empty text blocks, and a turn whose text is only whitespace
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content.strip() else []
    if m.role == "user" and not blocks:  # a message without text (a sticker, a photo): still the person's turn
        blocks = [{"type": "text", "text": EMPTY_MESSAGE}]
    if m.role == "user" and m.images:  # images before the text that asks about them, as the vision guide advises
        blocks = [{"type": "image", "source": {"type": "base64", "media_type": i.media_type, "data": i.data}}
                  for i in m.images] + blocks
    if m.role == "assistant":
        blocks += [{"type": "tool_use", "id": _id(c.id), "name": c.name, "input": c.arguments} for c in m.tool_calls]
        return "assistant", blocks
    if m.role == "user":
        return "user", blocks
    raise ValueError(f"unknown message role {m.role!r}")


def to_anthropic(system: str, messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """(system, messages) for the Messages API; system-role messages are appended to the system prompt."""
    systems = [system] if system else []
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.role == "system":
            if m.content:
                systems.append(m.content)
            continue
        role, blocks = _blocks(m)
        if not blocks:
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    for item in out:
        if item["role"] == "user":  # tool results first, then text (a stable sort keeps each group's order)
            item["content"].sort(key=lambda b: b["type"] != "tool_result")
    if out and out[0]["role"] == "assistant":
        out.insert(0, {"role": "user", "content": [{"type": "text", "text": HISTORY_CUT}]})
    return "\n\n".join(systems), out


def without_tool_blocks(messages: list[Message]) -> list[Message]:
    """The history as plain text: the API refuses tool_use and tool_result blocks in a request without tools."""
    out = []
    for m in messages:
        if m.role == "tool":
            out.append(Message("user", f"[result of {m.name or 'a tool call'}] {m.content}"))
        elif m.tool_calls:
            calls = " ".join(f"[called {c.name} {json.dumps(c.arguments, ensure_ascii=False)}]" for c in m.tool_calls)
            out.append(Message(m.role, f"{m.content}\n{calls}".strip()))
        else:
            out.append(m)
    return out


class AnthropicProvider(Provider):
    kind = "anthropic"

    def _endpoint(self) -> str:
        return f"{self.base_url}/messages" if self.base_url.endswith("/v1") else f"{self.base_url}/v1/messages"

    def _auth_headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key}

    def _extra_headers(self) -> dict[str, str]:
        return {"anthropic-version": API_VERSION}

    def _body(self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int) -> dict[str, Any]:
        system_text, wire = to_anthropic(system, messages if tools else without_tool_blocks(messages))
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "messages": wire}
        if system_text:
            body["system"] = system_text
        if tools:
            body["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in tools
            ]
        return body

    def _embedded_error(self, data: Any) -> tuple[int, Any] | None:
        if isinstance(data, dict) and data.get("type") == "error":
            return 502, data
        return None

    def _stream_reader(self) -> sse.StreamReader:
        return _Stream(self.model)

    def _parse(self, data: Any) -> ModelReply:
        content = data["content"]
        if not isinstance(content, list):
            raise Malformed("content is not a list")
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in content:
            kind = block["type"]
            if kind == "text":
                texts.append(block["text"])
            elif kind == "tool_use":
                args = block.get("input")
                if not isinstance(args, dict):
                    args = {"_raw": json.dumps(args)}
                calls.append(ToolCall(id=block["id"], name=block["name"], arguments=args))
            # thinking, redacted_thinking and server-tool blocks carry nothing the runner uses
        usage = data.get("usage") or {}
        input_tokens = sum(int(usage.get(k) or 0) for k in _INPUT_USAGE)
        return ModelReply(
            text="".join(texts),
            tool_calls=tuple(calls),
            usage=Usage(input_tokens=input_tokens, output_tokens=int(usage.get("output_tokens") or 0)),
            stop_reason=str(data.get("stop_reason") or ""),
            model=str(data.get("model") or self.model),
        )


def _tool_input(block: dict[str, Any]) -> dict[str, Any]:
    pieces = "".join(block["json"])
    if not pieces:
        args = block.get("input") or {}
    else:
        try:
            args = json.loads(pieces)
        except ValueError:
            return {"_raw": pieces}
    return args if isinstance(args, dict) else {"_raw": json.dumps(args)}


class _Stream(sse.StreamReader):
    """Messages stream events, gathered into the reply `_parse` would make of the whole message."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model
        self.blocks: dict[int, dict[str, Any]] = {}
        self.calls: list[ToolCall] = []
        self.usage: dict[str, Any] = {}
        self.stop_reason = ""
        self.done = False

    def event(self, event: sse.Event) -> None:
        data = json.loads(event.data)
        kind = data.get("type", event.name) if isinstance(data, dict) else None
        if kind is None:
            raise Malformed("an event is not an object")
        if kind == "error":
            error = data.get("error") if isinstance(data.get("error"), dict) else {}
            raise sse.StreamError(ERROR_STATUS.get(error.get("type"), 502), data)
        if kind == "message_start":
            message = data["message"]
            self.model = str(message.get("model") or self.model)
            self.usage.update(message.get("usage") or {})
        elif kind == "content_block_start":
            block = dict(data["content_block"])
            block["json"] = []
            self.blocks[int(data["index"])] = block
            if block["type"] == "text" and block.get("text"):
                self.parts.append(block["text"])
        elif kind == "content_block_delta":
            block = self.blocks[int(data["index"])]
            delta = data["delta"]
            if delta["type"] == "text_delta":
                self.parts.append(delta["text"])
            elif delta["type"] == "input_json_delta":
                block["json"].append(delta["partial_json"])
            # thinking_delta, signature_delta, citations_delta: nothing the runner uses
        elif kind == "content_block_stop":
            block = self.blocks[int(data["index"])]
            if block["type"] == "tool_use":
                self.calls.append(ToolCall(id=block["id"], name=block["name"], arguments=_tool_input(block)))
        elif kind == "message_delta":
            self.stop_reason = str((data.get("delta") or {}).get("stop_reason") or self.stop_reason)
            self.usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
        elif kind == "message_stop":
            self.done = True
        # ping, and any event type added later: skipped

    def ended(self) -> bool:
        return self.done

    def reply(self) -> ModelReply:
        return ModelReply(
            text="".join(self.parts),
            tool_calls=tuple(self.calls),
            usage=Usage(input_tokens=sum(int(self.usage.get(k) or 0) for k in _INPUT_USAGE),
                        output_tokens=int(self.usage.get("output_tokens") or 0)),
            stop_reason=self.stop_reason,
            model=self.model,
        )
