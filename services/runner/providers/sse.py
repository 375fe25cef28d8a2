"""Streamed answers: Server-Sent Events decoding, and the shape of a provider's stream reader.

The decoder follows the HTML Living Standard's event-stream rules, as far as model APIs use them: lines
end in LF, CRLF or CR; a line starting with ":" is a comment; "field: value" (one space after the colon
dropped); `data` lines of one event are joined with LF; a blank line dispatches the event (one with no
data is skipped); `event` names it ("message" when absent). `id` and `retry` are read and ignored: a cut
stream is retried whole, never resumed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from services.runner.llm import ModelReply


@dataclass(frozen=True)
class Event:
    name: str
    data: str


class Decoder:
    """Bytes in, whole events out; keeps the partial line and event across feeds."""

    def __init__(self) -> None:
        self._buffer = b""
        self._name = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        events: list[Event] = []
        buffer = self._buffer + chunk
        start = 0
        while True:
            cut = _line_end(buffer, start)
            if cut is None:
                break
            end, after = cut
            self._line(buffer[start:end].decode("utf-8", "replace"), events)
            start = after
        self._buffer = buffer[start:]
        return events

    def _line(self, line: str, events: list[Event]) -> None:
        if not line:
            if self._data:
                events.append(Event(self._name or "message", "\n".join(self._data)))
            self._name, self._data = "", []
            return
        if line.startswith(":"):
            return
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            self._data.append(value)
        elif field == "event":
            self._name = value


def _line_end(buffer: bytes, start: int) -> tuple[int, int] | None:
    """(end of the line, start of the next) for the first whole line from ``start``; None if there is none yet.
    A CR at the very end waits for the next byte: it may be the first half of a CRLF."""
    lf = buffer.find(b"\n", start)
    cr = buffer.find(b"\r", start, lf if lf >= 0 else len(buffer))
    if cr >= 0:
        if cr + 1 == len(buffer):
            return None
        return cr, cr + 2 if buffer[cr + 1:cr + 2] == b"\n" else cr + 1
    if lf >= 0:
        return lf, lf + 1
    return None


class StreamError(Exception):
    """An error the server sent inside a stream, as the HTTP status it stands for and its JSON."""

    def __init__(self, status: int, data: Any) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.data = data


class StreamReader(ABC):
    """One attempt's streamed answer, event by event (raises Malformed, KeyError, TypeError... on a bad one,
    StreamError on an error event)."""

    def __init__(self) -> None:
        self.parts: list[str] = []  # the answer's text as it came

    @abstractmethod
    def event(self, event: Event) -> None:
        """Take one event."""

    @abstractmethod
    def ended(self) -> bool:
        """Whether the answer is whole (its last event came): a stream that stops before is cut."""

    def whole(self) -> bool:
        """Whether the answer is whole once the stream ended (a server may leave out its last event)."""
        return self.ended()

    @abstractmethod
    def reply(self) -> ModelReply:
        """The whole answer, as the non-streaming path would give it."""
