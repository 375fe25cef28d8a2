"""OpenAI-compatible Chat Completions (`POST {base_url}/chat/completions`): OpenAI, OpenRouter, Ollama, vLLM, llama.cpp.

Tolerances for the servers that are almost compatible: `usage`, `id` and a tool call's `id` may be missing
(an id is made up); `arguments` may be a JSON string (the standard) or an object (some llama.cpp and Ollama
versions); `content` may be null, a string or a list of text parts; an error sent with HTTP 200 (OpenRouter
does this for upstream failures) is treated as the error it reports. `finish_reason` is passed on as is: some
servers say "stop" for a tool call, so callers should look at `tool_calls`, not at `stop_reason`.

Streamed (`stream: true` with `stream_options.include_usage`): chunks of `choices[0].delta` (content pieces;
tool calls by `index`, their id and name in the first piece, `arguments` in pieces to join), a
`finish_reason`, a last chunk with `usage` and no choices, then `data: [DONE]`. A chunk holding an `error`
(OpenRouter, vLLM) is that error. A server that sends no [DONE] is done once a finish_reason came and the
stream ends.

api.openai.com gets `max_completion_tokens` (its reasoning models refuse `max_tokens`); every other server
gets `max_tokens`, which all of them accept.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlsplit

from services.runner.llm import Message, ModelReply, ToolCall, ToolSpec, Usage
from services.runner.providers import sse
from services.runner.providers.base import Malformed, Provider


def _tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
    }


def to_openai_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
    """Neutral messages as Chat Completions messages, the system prompt first."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for m in messages:
        if m.role == "assistant":
            item: dict[str, Any] = {"role": "assistant", "content": m.content or (None if m.tool_calls else "")}
            if m.tool_calls:
                item["tool_calls"] = [_tool_call_json(c) for c in m.tool_calls]
            out.append(item)
        elif m.role == "tool":
            out.append({"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content})
        elif m.role == "user" and m.images:  # text first, then the images it names, as OpenAI's examples do
            parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            parts += [{"type": "image_url", "image_url": {"url": f"data:{i.media_type};base64,{i.data}"}}
                      for i in m.images]
            out.append({"role": "user", "content": parts})
        elif m.role in ("user", "system"):
            out.append({"role": m.role, "content": m.content})
        else:
            raise ValueError(f"unknown message role {m.role!r}")
    return out


def decode_arguments(raw: Any) -> dict[str, Any]:
    """A tool call's arguments as an object; text that is not a JSON object becomes {"_raw": text}."""
    if isinstance(raw, dict):
        return raw
    if raw is None or raw == "":
        return {}
    if not isinstance(raw, str):
        return {"_raw": json.dumps(raw)}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_raw": raw}


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise Malformed(f"message content is a {type(content).__name__}")


class OpenAIProvider(Provider):
    kind = "openai"

    def _endpoint(self) -> str:
        return f"{self.base_url}/chat/completions"

    def _auth_headers(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"}

    def _body(self, system: str, messages: list[Message], tools: list[ToolSpec], max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": to_openai_messages(system, messages)}
        if urlsplit(self.base_url).hostname == "api.openai.com":
            body["max_completion_tokens"] = max_tokens
        else:
            body["max_tokens"] = max_tokens
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in tools
            ]
        return body

    def _stream_body(self, body: dict[str, Any]) -> dict[str, Any]:
        return {**body, "stream": True, "stream_options": {"include_usage": True}}

    def _stream_reader(self) -> sse.StreamReader:
        return _Stream(self)

    def _embedded_error(self, data: Any) -> tuple[int, Any] | None:
        if isinstance(data, dict) and "choices" not in data and data.get("error"):
            err = data["error"]
            code = err.get("code") if isinstance(err, dict) else None
            status = code if isinstance(code, int) and 400 <= code <= 599 else 502
            return status, data
        return None

    def _parse(self, data: Any) -> ModelReply:
        choices = data["choices"]
        if not isinstance(choices, list) or not choices:
            raise Malformed("no choices")
        choice = choices[0]
        message = choice["message"]
        calls = []
        for i, raw in enumerate(message.get("tool_calls") or ()):
            fn = raw["function"]
            name = fn["name"]
            if not isinstance(name, str) or not name:
                raise Malformed("tool call without a name")
            call_id = raw.get("id") or f"call_{i}_{uuid.uuid4().hex[:12]}"
            calls.append(ToolCall(id=str(call_id), name=name, arguments=decode_arguments(fn.get("arguments"))))
        usage = data.get("usage") or {}
        return ModelReply(
            text=_text(message.get("content")),
            tool_calls=tuple(calls),
            usage=Usage(
                input_tokens=int(usage.get("prompt_tokens") or 0),
                output_tokens=int(usage.get("completion_tokens") or 0),
            ),
            stop_reason=str(choice.get("finish_reason") or ""),
            model=str(data.get("model") or self.model),
        )


class _Stream(sse.StreamReader):
    """Chat Completions chunks, gathered into the reply `_parse` would make of the whole answer."""

    def __init__(self, provider: OpenAIProvider) -> None:
        super().__init__()
        self.provider = provider
        self.calls: dict[int, dict[str, Any]] = {}  # by index: {"id", "name", "arguments": [pieces] | object}
        self.finish = ""
        self.usage: dict[str, Any] = {}
        self.model = ""
        self.done = False

    def event(self, event: sse.Event) -> None:
        if event.data.strip() == "[DONE]":
            self.done = True
            return
        data = json.loads(event.data)
        if not isinstance(data, dict):
            raise Malformed("a chunk is not an object")
        embedded = self.provider._embedded_error(data)
        if embedded is not None:
            raise sse.StreamError(*embedded)
        self.model = str(data.get("model") or self.model)
        if isinstance(data.get("usage"), dict):
            self.usage = data["usage"]
        for choice in data.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            content = _text(delta.get("content"))
            if content:
                self.parts.append(content)
            for position, piece in enumerate(delta.get("tool_calls") or ()):
                self._call_piece(piece, position)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])

    def _call_piece(self, piece: dict[str, Any], position: int) -> None:
        index = piece.get("index", position)
        call = self.calls.setdefault(int(index), {"id": "", "name": "", "arguments": []})
        if piece.get("id"):
            call["id"] = str(piece["id"])
        fn = piece.get("function") or {}
        if fn.get("name"):
            call["name"] = fn["name"]
        arguments = fn.get("arguments")
        if isinstance(arguments, dict):  # some llama.cpp and Ollama versions send the object whole
            call["arguments"] = arguments
        elif isinstance(arguments, str) and isinstance(call["arguments"], list):
            call["arguments"].append(arguments)

    def ended(self) -> bool:
        return self.done

    def whole(self) -> bool:
        return self.done or bool(self.finish)

    def reply(self) -> ModelReply:
        calls = []
        for i, index in enumerate(sorted(self.calls)):
            call = self.calls[index]
            if not isinstance(call["name"], str) or not call["name"]:
                raise Malformed("tool call without a name")
            raw = call["arguments"]
            arguments = decode_arguments("".join(raw) if isinstance(raw, list) else raw)
            call_id = call["id"] or f"call_{i}_{uuid.uuid4().hex[:12]}"
            calls.append(ToolCall(id=call_id, name=call["name"], arguments=arguments))
        return ModelReply(
            text="".join(self.parts),
            tool_calls=tuple(calls),
            usage=Usage(
                input_tokens=int(self.usage.get("prompt_tokens") or 0),
                output_tokens=int(self.usage.get("completion_tokens") or 0),
            ),
            stop_reason=self.finish,
            model=self.model or self.provider.model,
        )
