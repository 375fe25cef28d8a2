"""OpenAI-compatible Chat Completions (`POST {base_url}/chat/completions`): OpenAI, OpenRouter, Ollama, vLLM, llama.cpp.

Tolerances for the servers that are almost compatible: `usage`, `id` and a tool call's `id` may be missing
(an id is made up); `arguments` may be a JSON string (the standard) or an object (some llama.cpp and Ollama
versions); `content` may be null, a string or a list of text parts; an error sent with HTTP 200 (OpenRouter
does this for upstream failures) is treated as the error it reports. `finish_reason` is passed on as is: some
servers say "stop" for a tool call, so callers should look at `tool_calls`, not at `stop_reason`.

api.openai.com gets `max_completion_tokens` (its reasoning models refuse `max_tokens`); every other server
gets `max_tokens`, which all of them accept.
"""

from __future__ import annotations

import json
import uuid
from typing import Any
from urllib.parse import urlsplit

from services.runner.llm import Message, ModelReply, ToolCall, ToolSpec, Usage
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
