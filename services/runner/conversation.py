"""A session's turns as model messages, and where compaction may cut them.

Turns are stored one per message: a user turn; an assistant turn (its tool calls in ``meta``); a tool
turn (its call's id in ``meta``). A tool call is never separated from its result: the window and
the compaction cut both fall on user turns only, and a call whose result never came (the runner
died) gets a result saying so.
"""

from __future__ import annotations

import json

from common.stores import turn_store
from services.runner.llm import Message, ToolCall

INTERRUPTED = "This call was interrupted before it finished (the runner stopped); it may or may not have run."
CHARS_PER_TOKEN = 4  # a cheap, conservative estimate; providers count exactly in their usage


def to_messages(turns: list[turn_store.Turn]) -> tuple[list[Message], list[int]]:
    """Messages for the model, and for each one the id of the turn it came from."""
    messages: list[Message] = []
    ids: list[int] = []
    for turn in turns:
        meta = _meta(turn.meta)
        if turn.role == "user":
            messages.append(Message("user", turn.content))
        elif turn.role == "assistant":
            calls = tuple(ToolCall(c["id"], c["name"], c.get("arguments") or {}) for c in meta.get("tool_calls", []))
            messages.append(Message("assistant", turn.content, tool_calls=calls))
        elif turn.role == "tool":
            messages.append(Message("tool", turn.content, tool_call_id=meta.get("tool_call_id", ""),
                                    name=meta.get("name", "")))
        else:
            continue
        ids.append(turn.id)
    return _pair_calls(messages, ids)


def _pair_calls(messages: list[Message], ids: list[int]) -> tuple[list[Message], list[int]]:
    """Drop results whose call is outside the window; give unanswered calls an 'interrupted' result."""
    out: list[Message] = []
    out_ids: list[int] = []
    open_calls: dict[str, str] = {}
    for message, turn_id in zip(messages, ids):
        if message.role == "tool":
            if message.tool_call_id not in open_calls:
                continue
            open_calls.pop(message.tool_call_id)
        else:
            _close_open(open_calls, out, out_ids)
            if message.role == "assistant":
                open_calls = {c.id: c.name for c in message.tool_calls}
        out.append(message)
        out_ids.append(turn_id)
    return out, out_ids


def _close_open(open_calls: dict[str, str], out: list[Message], out_ids: list[int]) -> None:
    for call_id, name in open_calls.items():
        out.append(Message("tool", INTERRUPTED, tool_call_id=call_id, name=name))
        out_ids.append(out_ids[-1] if out_ids else 0)
    open_calls.clear()


def pending_calls(messages: list[Message]) -> list[ToolCall]:
    """Tool calls of the last assistant message that have no result yet (the turn resumes with them)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant":
            answered = {m.tool_call_id for m in messages[index + 1:] if m.role == "tool"}
            return [c for c in message.tool_calls if c.id not in answered]
        if message.role == "user":
            return []
    return []


def estimate_tokens(system: str, messages: list[Message]) -> int:
    size = len(system)
    for message in messages:
        size += len(message.content) + 16
        for call in message.tool_calls:
            size += len(call.name) + len(json.dumps(call.arguments)) + 16
    return size // CHARS_PER_TOKEN + 1


def compaction_cut(messages: list[Message], keep_recent_tokens: int) -> int:
    """Index of the first message to keep verbatim: the latest user message leaving at least
    ``keep_recent_tokens`` of recent conversation, never the very first (0 = nothing to compact)."""
    budget = 0
    cut = 0
    for index in range(len(messages) - 1, 0, -1):
        budget += estimate_tokens("", [messages[index]])
        if messages[index].role == "user":
            cut = index
            if budget >= keep_recent_tokens:
                break
    return cut


def transcript(messages: list[Message]) -> str:
    """Plain text of messages, for the model to summarise."""
    lines = []
    for message in messages:
        if message.role == "tool":
            lines.append(f"[tool {message.name} result] {message.content[:2000]}")
        elif message.tool_calls:
            calls = ", ".join(f"{c.name}({json.dumps(c.arguments)[:300]})" for c in message.tool_calls)
            lines.append(f"assistant: {message.content} [calls: {calls}]")
        else:
            lines.append(f"{message.role}: {message.content}")
    return "\n".join(lines)


def tool_calls_meta(calls: tuple[ToolCall, ...]) -> str:
    return json.dumps({"tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]})


def _meta(text: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
