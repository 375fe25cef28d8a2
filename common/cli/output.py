"""How the CLI speaks: tables and colour for people (colour only on a terminal), JSON for scripts."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Iterable, Sequence

_COLOURS = {"green": "32", "red": "31", "yellow": "33", "dim": "2", "bold": "1"}


def use_colour(stream=None) -> bool:
    stream = stream or sys.stdout
    return stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def paint(text: str, colour: str, stream=None) -> str:
    if not use_colour(stream):
        return text
    return f"\033[{_COLOURS[colour]}m{text}\033[0m"


def state_colour(state: str) -> str:
    if state in ("ready", "RUNNING", "ok", "idle"):
        return "green"
    if state in ("not configured", "not running"):
        return "dim"
    if state in ("degraded", "STARTING", "BACKOFF", "stopping", "STOPPING", "missing"):
        return "yellow"
    return "red"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], colour_column: int | None = None) -> str:
    """A plain aligned table; the values of ``colour_column`` are coloured by state on a terminal."""
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        parts = []
        for i, value in enumerate(row):
            padded = value.ljust(widths[i]) if i < len(row) - 1 else value
            if n == 0:
                padded = paint(padded, "bold")
            elif i == colour_column:
                padded = paint(padded, state_colour(value))
            parts.append(padded)
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def emit_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def error(message: str) -> None:
    print(paint("error:", "red", sys.stderr) + " " + message, file=sys.stderr)


def warn(message: str) -> None:
    print(paint("warning:", "yellow", sys.stderr) + " " + message, file=sys.stderr)


def ago(seconds_since_epoch: float | None, now: float | None = None) -> str:
    """'3s ago', '5m ago', '2h ago' ('-' for never)."""
    if not seconds_since_epoch:
        return "-"
    return duration((now or time.time()) - seconds_since_epoch) + " ago"


def duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


class Progress:
    """A one-line progress indicator on stderr when it is a terminal; silent otherwise."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.monotonic()
        self.live = sys.stderr.isatty()

    def update(self, done: float | None = None, total: float | None = None) -> None:
        if not self.live:
            return
        elapsed = duration(time.monotonic() - self.started)
        if done is not None and total:
            text = f"{self.label}: {done / total:6.1%} ({elapsed})"
        else:
            text = f"{self.label}… {elapsed}"
        print("\r" + text, end="", file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.live:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
