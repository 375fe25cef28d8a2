"""How the dashboard writes values for people: times, ages, sizes, money, JSON, and search highlights
(the only markup built outside a template, from escaped text)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from markupsafe import Markup, escape

if TYPE_CHECKING:
    import jinja2

HIT_START, HIT_END = "\x02", "\x03"  # what dashboard_views_store.search puts around matched words


def when(at: float | None) -> str:
    if not at:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = abs(float(seconds))
    if s < 60:
        text = f"{s:.0f}s"
    elif s < 3600:
        text = f"{s // 60:.0f}m {s % 60:.0f}s"
    elif s < 86400:
        text = f"{s // 3600:.0f}h {s % 3600 // 60:.0f}m"
    else:
        text = f"{s // 86400:.0f}d {s % 86400 // 3600:.0f}h"
    return text if seconds >= 0 else f"-{text}"


def ago(at: float | None) -> str:
    return "-" if not at else f"{duration(time.time() - at)} ago"


def size(n: int | float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def usd(value: float | None) -> str:
    value = value or 0.0
    return f"${value:.4f}" if value < 1 else f"${value:,.2f}"


def pretty_json(text: str) -> str:
    """A JSON text indented for reading; other text as it is."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return text


def highlight(snippet: str) -> Markup:
    """A search snippet with its hits in <mark>: everything else escaped."""
    out, marked = [], False
    for part in snippet.replace(HIT_END, HIT_START).split(HIT_START):
        out.append(f"<mark>{escape(part)}</mark>" if marked else str(escape(part)))
        marked = not marked
    return Markup("".join(out))


def install(env: jinja2.Environment) -> None:
    env.filters.update(when=when, ago=ago, duration=duration, size=size, usd=usd, pretty_json=pretty_json,
                       highlight=highlight)
