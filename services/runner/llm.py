"""The runner's model vocabulary: messages, tool specs and replies, independent of any provider's format."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]  # decoded JSON object; a model's malformed arguments become {"_raw": "..."}


@dataclass(frozen=True)
class Image:
    """An image for a vision model, already within the provider's limits (services/runner/media.py)."""

    media_type: str  # image/jpeg | image/png | image/gif | image/webp
    data: str  # base64


@dataclass(frozen=True)
class Message:
    """One conversation message in provider-neutral form.

    role: "user" | "assistant" | "tool". An assistant message may carry ``tool_calls``; a tool message
    answers one call (``tool_call_id``, ``name``). A user message may carry ``images`` (sent as image parts).
    The system prompt is passed separately.
    """

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    mark: str = ""  # a tool message that stands in for a result: "started" (never finished) or "waiting"
    attachments: tuple[str, ...] = ()  # a user message's inbound files (paths under data/attachments)
    images: tuple[Image, ...] = ()  # a user message's images, for a provider marked vision = true


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True)
class ModelReply:
    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = ""  # the provider's own word (stop, tool_calls, end_turn, tool_use, length, ...)
    model: str = ""


class ProviderError(Exception):
    """A model call that failed for good (after retries). ``user_text`` is safe to show the person."""

    def __init__(self, kind: str, user_text: str, detail: str = "") -> None:
        super().__init__(detail or user_text)
        # missing_key | unreachable | timeout | rate_limited | quota | server_error | auth | bad_request | malformed
        self.kind = kind
        self.user_text = user_text
        self.detail = detail
