"""A session's turns as model messages, and where compaction may cut them.

Turns are stored one per message: a user turn; an assistant turn (its tool calls in ``meta``); a tool
turn (its call's id in ``meta``). Before a tool runs, a stand-in result marked "started" is stored;
the real result, stored after, replaces it. So a call that was running when its runner died is
shown to the model as interrupted and is never run twice; a call parked for approval has a
"waiting" stand-in until it is decided. Whatever was stored, the model gets exactly one tool message
per call, right after the assistant message that made it (``to_messages``, and ``put_result`` for a
turn under way). A tool call is never separated from its result: the window and the compaction cut
both fall on user turns only.
"""

from __future__ import annotations

import json

from common.stores import turn_store
from services.runner.llm import Message, ToolCall

INTERRUPTED = ("This call was interrupted before it finished (its runner stopped); it may or may not have run,"
               " and it was not run again.")
WAITING = "Waiting for the person's approval; this call has not run."
UNANSWERED = "This call got no result."
CHARS_PER_TOKEN = 4  # a cheap, conservative estimate; providers count exactly in their usage
IMAGE_TOKENS = 1600  # an image at the providers' usual scale (Anthropic: about 1,600 at 1.15 megapixels)


def to_messages(turns: list[turn_store.Turn]) -> tuple[list[Message], list[int]]:
    """Messages for the model, and for each one the id of the turn it came from."""
    messages: list[Message] = []
    ids: list[int] = []
    for turn in turns:
        meta = _meta(turn.meta)
        if turn.role == "user":
            messages.append(Message("user", turn.content, attachments=_paths(turn.attachments)))
        elif turn.role == "assistant":
            calls = tuple(ToolCall(c["id"], c["name"], c.get("arguments") or {}) for c in meta.get("tool_calls", []))
            messages.append(Message("assistant", turn.content, tool_calls=calls))
        elif turn.role == "tool":
            messages.append(Message("tool", turn.content, tool_call_id=meta.get("tool_call_id", ""),
                                    name=meta.get("name", ""), mark=meta.get("mark", "")))
        else:
            continue
        ids.append(turn.id)
    return _pair_calls(messages, ids)


def _pair_calls(messages: list[Message], ids: list[int]) -> tuple[list[Message], list[int]]:
    """Each call followed by its latest result; results without their call dropped; calls without any
    result given one (an older runner's gap)."""
    out: list[Message] = []
    out_ids: list[int] = []
    open_calls: dict[str, str] = {}
    answered: dict[str, int] = {}  # call id -> index of its result in ``out``
    for message, turn_id in zip(messages, ids):
        if message.role == "tool":
            if message.tool_call_id in answered:  # a later result replaces the stand-in
                out[answered[message.tool_call_id]] = message
                continue
            if message.tool_call_id not in open_calls:
                continue
            open_calls.pop(message.tool_call_id)
            answered[message.tool_call_id] = len(out)
        else:
            _close_open(open_calls, out, out_ids)
            if message.role == "assistant":
                open_calls = {c.id: c.name for c in message.tool_calls}
                answered = {}
        out.append(message)
        out_ids.append(turn_id)
    return out, out_ids


def _close_open(open_calls: dict[str, str], out: list[Message], out_ids: list[int]) -> None:
    for call_id, name in open_calls.items():
        out.append(Message("tool", UNANSWERED, tool_call_id=call_id, name=name))
        out_ids.append(out_ids[-1] if out_ids else 0)
    open_calls.clear()


def put_result(messages: list[Message], result: Message) -> None:
    """Record a call's result in ``messages`` as loading it again would show it: in place of the stand-in
    ("waiting", "started") that answers the same call after the last assistant message, else appended.
    So one tool message per call reaches the model, never a stand-in and then the result."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant":
            break
        if message.role == "tool" and message.tool_call_id == result.tool_call_id:
            messages[index] = result
            return
    messages.append(result)


def pending_calls(messages: list[Message]) -> list[ToolCall]:
    """Calls of the last assistant message still to run: without a result, or waiting for approval."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role == "assistant":
            done = {m.tool_call_id for m in messages[index + 1:] if m.role == "tool" and m.mark != "waiting"}
            return [c for c in message.tool_calls if c.id not in done]
        if message.role == "user":
            return []
    return []


def estimate_tokens(system: str, messages: list[Message]) -> int:
    size = len(system)
    for message in messages:
        size += len(message.content) + 16
        size += len(message.images) * IMAGE_TOKENS * CHARS_PER_TOKEN
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


def transcript(messages: list[Message], max_chars: int) -> str:
    """Plain text of messages for the model to summarise, each message and the whole bounded (the
    newest part is kept when it must be cut)."""
    lines = []
    for message in messages:
        if message.role == "tool":
            lines.append(f"[tool {message.name} result] {_clip(message.content, 1000)}")
        elif message.tool_calls:
            calls = ", ".join(f"{c.name}({json.dumps(c.arguments)[:300]})" for c in message.tool_calls)
            lines.append(f"assistant: {_clip(message.content, 2000)} [calls: {calls}]")
        else:
            lines.append(f"{message.role}: {_clip(message.content, 2000)}")
    text = "\n".join(lines)
    return text if len(text) <= max_chars else "[…]\n" + text[-max_chars:]


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " […]"


def tool_calls_meta(calls: tuple[ToolCall, ...]) -> str:
    return json.dumps({"tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]})


def _paths(text: str) -> tuple[str, ...]:
    try:
        value = json.loads(text or "[]")
    except ValueError:
        return ()
    return tuple(p for p in value if isinstance(p, str)) if isinstance(value, list) else ()


def _meta(text: str) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
