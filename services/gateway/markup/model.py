"""The agent's Markdown as a small document model: blocks of inline spans, parsed once for every renderer.

The grammar is the CommonMark-ish subset the agents write, read line by line: lines stay lines
(chat apps render newlines), so a paragraph is its lines and a blank line is an empty Line. What
the grammar does not recognise is text, so a renderer never meets a construct it cannot write.
Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal, Union
from urllib.parse import urlsplit

Style = Literal["bold", "italic", "strike"]

# --- The model ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(frozen=True, slots=True)
class Code:
    """An inline code span (its text unescaped, as the reader should see it)."""

    text: str


@dataclass(frozen=True, slots=True)
class Emphasis:
    style: Style
    children: tuple[Inline, ...]
    after: str  # the source character just after the span ("" at the end of its line)


@dataclass(frozen=True, slots=True)
class Link:
    url: str  # as written: a renderer decides whether its scheme is safe
    children: tuple[Inline, ...]  # the label (links inside it are text)
    after: str


@dataclass(frozen=True, slots=True)
class Url:
    """A bare URL, as written (its _ and * are never emphasis), without the punctuation after it."""

    text: str


@dataclass(frozen=True, slots=True)
class Angle:
    """<...> syntax: an autolink <https://…>, a Slack mention <@U…>/<#C…>, a broadcast <!here>."""

    kind: Literal["autolink", "mention", "broadcast"]
    source: str  # brackets included


Inline = Union[Text, Code, Emphasis, Link, Url, Angle]


@dataclass(frozen=True, slots=True)
class Line:
    """One line of a paragraph (no spans: a blank line)."""

    spans: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Heading:
    spans: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Item:
    """A bullet list item; `indent` is its leading whitespace, as written (depth = len(indent) // 2)."""

    indent: str
    spans: tuple[Inline, ...]


@dataclass(frozen=True, slots=True)
class Quote:
    lines: tuple[Line | Heading | Item, ...]


@dataclass(frozen=True, slots=True)
class CodeBlock:
    body: str  # without trailing newlines
    language: str  # "" when the fence names none (or names something that is not a language)


Block = Union[Line, Heading, Item, Quote, CodeBlock]

# --- The grammar ----------------------------------------------------------------------------------

FENCE_OPEN: Final = re.compile(r" {0,3}(`{3,})[ \t]*([^`]*)")
FENCE_CLOSE: Final = re.compile(r" {0,3}(`{3,})[ \t]*")
LANGUAGE: Final = re.compile(r"[A-Za-z0-9_+#.-]{1,32}")
QUOTE: Final = re.compile(r" {0,3}> ?(.*)")
HEADING: Final = re.compile(r" {0,3}#{1,6}[ \t]+(.*?)[ \t#]*")
BULLET: Final = re.compile(r"([ \t]*)[-*+][ \t]+(.*)")

CODE_SPAN: Final = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)")
BACKTICKS: Final = re.compile(r"`+")
LINK: Final = re.compile(r"\[([^\[\]\n]+)\]\([ \t]*([^\s()]+(?:\([^\s()]*\)[^\s()]*)*)[ \t]*\)")
ESCAPABLE: Final = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_SPECIAL: Final = re.compile(r"[\\`*_~\[<]|(?<![\w/])(?:https?|tg)://")
_BARE_URL: Final = re.compile(r"(?:https?|tg)://[^\s<>\"|`]+")
_URL_TRAILING: Final = frozenset(".,:;!?'\"*_~")
_ANGLE: Final = (
    ("mention", re.compile(r"<(?:@[UW]|#[CG])[A-Z0-9]{2,}(?:\|[^<>|&\n]*)?>")),
    ("broadcast", re.compile(r"<!(?:here|channel|everyone|subteam\^S[A-Z0-9]{2,})(?:\|[^<>|&\n]*)?>")),
    ("autolink", re.compile(r"<(?:https?|mailto):[^\s<>|`]+>")),
)

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
_LOOKAHEAD: Final = 1_000  # a span's closing marker is looked for this far ahead (else unclosed markers cost n²)
_MAX_NESTING: Final = 8  # deeper inline markup is text (keeps recursion bounded)


def parse(markdown: str) -> tuple[Block, ...]:
    """The blocks of `markdown`. A fence without a closing ``` runs to the end; consecutive
    "> " lines are one quote; "#" headings and "-"/"*"/"+" bullets are read in quotes too."""
    lines = markdown.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if fence := FENCE_OPEN.fullmatch(lines[i]):
            ticks, body = len(fence.group(1)), []
            i += 1
            while i < len(lines):
                close = FENCE_CLOSE.fullmatch(lines[i])
                if close and len(close.group(1)) >= ticks:
                    break
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence (or past the end)
            words = fence.group(2).split()
            language = words[0] if words and LANGUAGE.fullmatch(words[0]) else ""
            blocks.append(CodeBlock("\n".join(body).rstrip("\n"), language))
        elif QUOTE.fullmatch(lines[i]):
            quoted = []
            while i < len(lines) and (quote := QUOTE.fullmatch(lines[i])):
                quoted.append(_line(quote.group(1)))
                i += 1
            blocks.append(Quote(tuple(quoted)))
        else:
            blocks.append(_line(lines[i]))
            i += 1
    return tuple(blocks)


def _line(line: str) -> Line | Heading | Item:
    if heading := HEADING.fullmatch(line):
        title = heading.group(1)
        return Heading(inline(title)) if title.strip() else Line(())
    if bullet := BULLET.fullmatch(line):
        return Item(bullet.group(1), inline(bullet.group(2)))
    return Line(inline(line))


def _trim_url(url: str) -> str:
    """A bare URL without the sentence punctuation after it (and without an unbalanced ")")."""
    while url[-1] in _URL_TRAILING or (url[-1] == ")" and url.count(")") > url.count("(")):
        url = url[:-1]
    return url


def _next(s: str, at: int, after: str) -> str:
    """The character a reader sees after s[:at]: an escaped one counts as itself."""
    if at >= len(s):
        return after
    return s[at + 1] if s[at] == "\\" and at + 1 < len(s) else s[at]


def inline(s: str, after: str = "", links: bool = True, depth: int = 0) -> tuple[Inline, ...]:
    """One line of inline Markdown as spans; `after` is the character after it (for Emphasis.after)."""
    if depth > _MAX_NESTING:
        return (Text(s),) if s else ()
    out: list[Inline] = []
    buf: list[str] = []

    def emit(span: Inline) -> None:
        if buf and (text := "".join(buf)):
            out.append(Text(text))
        buf.clear()
        out.append(span)

    i, n = 0, len(s)
    while i < n:
        m = _SPECIAL.search(s, i)
        if m is None:
            buf.append(s[i:])
            break
        buf.append(s[i : m.start()])
        i = m.start()
        c, end = s[i], min(n, i + _LOOKAHEAD)
        if len(m.group()) > 1:
            url = _BARE_URL.match(s, i)
            if url is None:  # a scheme and nothing after it
                buf.append(m.group())
                i = m.end()
            else:
                bare = _trim_url(url.group())
                emit(Url(bare))
                i += len(bare)
        elif c == "\\":
            escaped = i + 1 < n and s[i + 1] in ESCAPABLE
            buf.append(s[i + 1] if escaped else c)
            i += 2 if escaped else 1
        elif c == "`":
            if code := CODE_SPAN.match(s, i, end):
                body = code.group(2)
                if len(body) > 2 and body[0] == body[-1] == " " and body.strip():
                    body = body[1:-1]
                emit(Code(body))
                i = code.end()
            else:
                run = BACKTICKS.match(s, i)
                assert run is not None
                buf.append(run.group())
                i = run.end()
        elif c == "[":
            if link := LINK.match(s, i, end) if links else None:
                nxt = _next(s, link.end(), after)
                emit(Link(link.group(2), inline(link.group(1), nxt, False, depth + 1), nxt))
                i = link.end()
            else:
                buf.append(c)
                i += 1
        elif c == "<":
            found = next(((kind, m) for kind, p in _ANGLE if (m := p.match(s, i))), None)
            if found:
                emit(Angle(found[0], found[1].group()))  # type: ignore[arg-type]
                i = found[1].end()
            else:
                buf.append(c)
                i += 1
        else:
            prev = s[i - 1] if i else ""
            for style, pattern, at_boundary in EMPHASIS[c]:
                if at_boundary and prev.isalnum():
                    continue
                if span := pattern.match(s, i, end):
                    nxt = _next(s, span.end(), after)
                    emit(Emphasis(style, inline(span.group(1), nxt, links, depth + 1), nxt))
                    i = span.end()
                    break
            else:
                buf.append(c)
                i += 1
    if buf and (text := "".join(buf)):
        out.append(Text(text))
    return tuple(out)


def text_of(spans: tuple[Inline, ...]) -> str:
    """What a reader sees of `spans` with no markup at all (links as their label)."""
    parts = []
    for span in spans:
        if isinstance(span, (Emphasis, Link)):
            parts.append(text_of(span.children))
        else:
            parts.append(span.source if isinstance(span, Angle) else span.text)
    return "".join(parts)


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


def collapse_blank(blocks: list[str]) -> str:
    """Join rendered blocks with newlines; a run of blank ones becomes one blank line, none at the ends."""
    kept: list[str] = []
    for block in blocks:
        if block.strip():
            kept.append(block)
        elif kept and kept[-1]:
            kept.append("")
    while kept and not kept[-1]:
        kept.pop()
    return "\n".join(kept)
