"""WhatsApp text: the agent's Markdown in WhatsApp's own markup (*bold*, _italic_, ~strike~,
```monospace```, `inline code`) and split at 4,096 characters without breaking a code block.

WhatsApp has no escaping and no links markup: a link is written as "text (url)". Pure functions."""

from __future__ import annotations

import re

TEXT_LIMIT = 4096

_FENCE = re.compile(r"^ {0,3}```")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_ITALIC_STAR = re.compile(r"(?<![*\w])\*(?=[^\s*])([^*\n]+?)(?<=[^\s*])\*(?![*\w])")
_LINK = re.compile(r"\[([^\]\n]+)\]\((\S+?)\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _inline(line: str) -> str:
    spans: list[str] = []

    def keep(match: re.Match) -> str:  # code spans are left exactly as written
        spans.append(f"`{match.group(2)}`")
        return f"\x00{len(spans) - 1}\x00"

    line = _CODE_SPAN.sub(keep, line)
    line = _LINK.sub(lambda mt: mt.group(1) if mt.group(1) == mt.group(2) else f"{mt.group(1)} ({mt.group(2)})", line)
    line = _ITALIC_STAR.sub(lambda mt: f"_{mt.group(1)}_", line)
    line = _BOLD.sub(lambda mt: f"*{mt.group(1) or mt.group(2)}*", line)
    line = _STRIKE.sub(lambda mt: f"~{mt.group(1)}~", line)
    return re.sub("\x00(\\d+)\x00", lambda mt: spans[int(mt.group(1))], line)


def to_whatsapp(markdown: str) -> str:
    out: list[str] = []
    in_code = False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_code = not in_code
            out.append("```")
            continue
        if in_code:
            out.append(line)
            continue
        heading = _HEADING.match(line)
        out.append(f"*{_inline(heading.group(1))}*" if heading and heading.group(1) else _inline(line))
    if in_code:
        out.append("```")
    return "\n".join(out).strip()


def split_text(text: str, limit: int = TEXT_LIMIT) -> list[str]:
    """Parts of at most ``limit`` characters, cut at a paragraph, line or word where possible; a code
    block cut in two is closed at the end of one part and reopened at the start of the next."""
    parts: list[str] = []
    rest = text
    reopen = False
    while rest:
        head = "```\n" if reopen else ""
        room = limit - len(head)
        if len(rest) <= room:
            parts.append(head + rest)
            break
        room -= 4  # keep space to close a code block: "\n```"
        window = rest[:room]
        cut = max(window.rfind("\n\n"), window.rfind("\n"))
        if cut < room // 2:
            cut = window.rfind(" ")
        if cut < room // 4:
            cut = room
        piece, rest = rest[:cut], rest[cut:].lstrip("\n") if cut < len(rest) else ""
        fences = sum(1 for ln in (head + piece).splitlines() if _FENCE.match(ln))
        open_code = fences % 2 == 1
        parts.append(head + piece + ("\n```" if open_code else ""))
        reopen = open_code
    return [p for p in parts if p.strip()]
