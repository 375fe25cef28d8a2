"""What every gateway's text formatter shares: the agent-Markdown grammar, UTF-16 length, links.

Pure functions and compiled patterns, no I/O. Each platform's formatter
(services/gateway/<platform>/format.py) reads the agent's Markdown with these patterns, so a reply
is understood the same way everywhere; only the output syntax and the splitting rules differ.
"""

from __future__ import annotations

import re
from typing import Final, Literal
from urllib.parse import urlsplit

Style = Literal["bold", "italic", "strike"]


def utf16_len(text: str) -> int:
    """Length of `text` in UTF-16 code units (astral characters count 2); never under len(text)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def safe_url(url: str, schemes: frozenset[str]) -> bool:
    """True when `url` has one of `schemes` (lower case) and, for http(s), a host.

    So javascript:, data:, file: and relative links are never safe unless a caller lists them.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    scheme = parts.scheme.lower()
    if scheme not in schemes:
        return False
    if scheme in ("http", "https"):
        return bool(parts.netloc)
    return bool(parts.path or parts.netloc)


# --- The Markdown the agents write (CommonMark-ish) ---------------------------------------------

# Block level, matched against whole lines (fullmatch).
FENCE_OPEN: Final = re.compile(r" {0,3}(`{3,})[ \t]*([^`]*)")
FENCE_CLOSE: Final = re.compile(r" {0,3}(`{3,})[ \t]*")
LANGUAGE: Final = re.compile(r"[A-Za-z0-9_+#.-]{1,32}")
QUOTE: Final = re.compile(r" {0,3}> ?(.*)")
HEADING: Final = re.compile(r" {0,3}#{1,6}[ \t]+(.*?)[ \t#]*")
BULLET: Final = re.compile(r"([ \t]*)[-*+][ \t]+(.*)")

# Inline, matched at a position (match).
CODE_SPAN: Final = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")
BACKTICKS: Final = re.compile(r"`+")
LINK: Final = re.compile(
    r"\[([^\[\]\n]+)\]\([ \t]*([^\s()]+(?:\([^\s()]*\)[^\s()]*)*)[ \t]*\)"
)
ESCAPABLE: Final = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")

# Per delimiter character: (style, pattern, must not follow a letter or digit). Single * and _ only
# count at word boundaries, so "2*3*4" and "snake_case_name" stay literal.
EMPHASIS: Final[dict[str, tuple[tuple[Style, re.Pattern[str], bool], ...]]] = {
    "*": (
        ("bold", re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*(?!\*)"), False),
        ("italic", re.compile(r"\*(?=[^\s*])(.+?)(?<=[^\s*])\*(?!\w)"), True),
    ),
    "_": (
        ("bold", re.compile(r"__(?=\S)(.+?)(?<=\S)__(?!\w)"), True),
        ("italic", re.compile(r"_(?=[^\s_])(.+?)(?<=[^\s_])_(?!\w)"), True),
    ),
    "~": (("strike", re.compile(r"~~(?=\S)(.+?)(?<=\S)~~"), False),),
}


def lines_of(markdown: str) -> list[str]:
    """The lines of `markdown`, with \\r\\n and lone \\r read as \\n."""
    return markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def collapse_blank(blocks: list[str]) -> str:
    """Join blocks with newlines; a run of blank blocks becomes one blank line, none at the ends."""
    kept: list[str] = []
    for block in blocks:
        if not block.strip():
            if kept and kept[-1]:
                kept.append("")
        else:
            kept.append(block)
    while kept and not kept[-1]:
        kept.pop()
    return "\n".join(kept)
