"""Charts drawn on the server as SVG (no chart library in the browser): stacked bars per day, with an
axis, a few gridlines and a legend. Every text in it is escaped."""

from __future__ import annotations

import math

from markupsafe import Markup, escape

WIDTH, HEIGHT = 900, 260
LEFT, RIGHT, TOP, BOTTOM = 70, 10, 20, 50
COLOURS = ("#3b6ea5", "#e0913b", "#5a9e5a", "#b44b4b", "#8a6bb0", "#6b8e9e", "#c0a030", "#999999")


def _nice(top: float) -> float:
    """A round axis maximum at or above ``top``."""
    if top <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(top))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= top:
            return step * magnitude
    return 10 * magnitude


def _label(value: float, unit: str) -> str:
    if unit == "$":
        return f"${value:.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:g}"


def stacked_bars(labels: list[str], series: dict[str, list[float]], unit: str = "", title: str = "") -> Markup:
    """One bar per label, the series stacked in it; ``labels`` are shown below (thinned when many)."""
    width = WIDTH - LEFT - RIGHT
    height = HEIGHT - TOP - BOTTOM
    n = max(1, len(labels))
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    top = _nice(max(totals, default=0.0))
    slot = width / n
    bar = max(1.0, slot * 0.7)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" class="chart" role="img"'
             f' aria-label="{escape(title)}"><title>{escape(title)}</title>',
             f'<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>']
    for k in range(5):  # gridlines and their values
        value = top * k / 4
        y = TOP + height - height * k / 4
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#dddddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11"'
                     f' fill="#555555">{escape(_label(value, unit))}</text>')
    every = max(1, n // 10)
    for i, label in enumerate(labels):
        x = LEFT + i * slot + (slot - bar) / 2
        base = TOP + height
        for colour, (name, values) in zip(_cycle(), series.items()):
            h = height * values[i] / top if top else 0
            if h > 0:
                parts.append(f'<rect x="{x:.1f}" y="{base - h:.1f}" width="{bar:.1f}" height="{h:.1f}"'
                             f' fill="{colour}"><title>{escape(label)} {escape(name)}:'
                             f' {escape(_label(values[i], unit))}</title></rect>')
                base -= h
        if i % every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{TOP + height + 16}" text-anchor="middle" font-size="11"'
                         f' fill="#555555">{escape(label[5:] if len(label) == 10 else label)}</text>')
    x = LEFT
    for colour, name in zip(_cycle(), series):
        parts.append(f'<rect x="{x}" y="{HEIGHT - 18}" width="12" height="12" fill="{colour}"/>')
        parts.append(f'<text x="{x + 16}" y="{HEIGHT - 8}" font-size="12" fill="#333333">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    if not any(totals):
        parts.append(f'<text x="{LEFT + width / 2}" y="{TOP + height / 2}" text-anchor="middle" font-size="14"'
                     ' fill="#777777">nothing in this period</text>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _cycle():
    while True:
        yield from COLOURS
