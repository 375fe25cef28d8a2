"""Telegram text formatting: agent Markdown to Telegram HTML, UTF-16-aware splitting, plain-text fallback.

Pure functions, no I/O. Facts from the Bot API "Formatting options" section:

- sendMessage text is 1-4096 characters after entities parsing, counted in UTF-16 code units.
  `split_html` measures the HTML itself (tags included), which is never shorter, so parts always fit.
- HTML mode supports b/strong, i/em, u/ins, s/strike/del, tg-spoiler, a href, code, pre,
  pre > code class="language-x" and blockquote [expandable]. `to_html` emits only
  b, i, s, code, pre, a and blockquote.
- Every <, > and & that is not markup must be written &lt; &gt; &amp;; only those named entities
  and &quot; (plus numeric entities) are understood.

`to_html` is deliberately small: what it does not recognise comes out as escaped text, and every
tag it writes is opened and closed by the same call, so its output is always balanced.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Final

from services.gateway.text import (
    BACKTICKS as _BACKTICKS,
    BULLET as _BULLET,
    CODE_SPAN as _CODE_SPAN,
    EMPHASIS,
    ESCAPABLE as _ESCAPABLE,
    FENCE_CLOSE as _FENCE_CLOSE,
    FENCE_OPEN as _FENCE_OPEN,
    HEADING as _HEADING,
    LANGUAGE as _LANGUAGE,
    LINK as _LINK,
    QUOTE as _QUOTE,
    collapse_blank,
    lines_of,
    safe_url,
    utf16_len,
)

TELEGRAM_TEXT_LIMIT: Final = 4096
LINK_SCHEMES: Final = frozenset({"http", "https", "tg", "mailto"})

_MIN_LIMIT: Final = 32  # room for a few nested tags plus one entity
_ATOM_MARGIN: Final = (
    16  # the largest indivisible text unit (an entity such as &#1114111;) fits in this
)
_LOOKAHEAD: Final = 1_000  # a span's closing marker is looked for this far ahead (else unclosed markers cost n²)
_MAX_NESTING: Final = (
    8  # deeper inline markup is written as text (keeps recursion bounded)
)


# --- Markdown to HTML -------------------------------------------------------------------------

_SPECIAL = re.compile(r"[\\`*_~\[]|(?<![\w/])(?:https?|tg)://")
_BARE_URL = re.compile(r"(?:https?|tg)://[^\s<>\"]+")
_TAGS: Final = {"bold": "b", "italic": "i", "strike": "s"}

# Per delimiter character: (tag, pattern, must not follow a letter or digit); the patterns are shared.
_EMPHASIS: Final = {
    char: tuple((_TAGS[style], pattern, boundary) for style, pattern, boundary in rules)
    for char, rules in EMPHASIS.items()
}


def _text(s: str) -> str:
    return html.escape(s, quote=False)


def _attr(s: str) -> str:
    return html.escape(s, quote=True)


def _safe_url(url: str) -> bool:
    return safe_url(url, LINK_SCHEMES)


def _inline(s: str, links: bool = True, depth: int = 0) -> str:
    """One line of inline Markdown to HTML; anything unrecognised is escaped text."""
    if depth > _MAX_NESTING:
        return _text(s)
    out: list[str] = []
    plain: list[str] = []

    def emit(markup: str) -> None:
        out.append(_text("".join(plain)))
        plain.clear()
        out.append(markup)

    i, n = 0, len(s)
    while i < n:
        m = _SPECIAL.search(s, i)
        if m is None:
            plain.append(s[i:])
            break
        plain.append(s[i : m.start()])
        i = m.start()
        c = s[i]
        prev = s[i - 1] if i else ""
        if len(m.group()) > 1:  # a bare URL: literal, so its _ and * are not emphasis
            url = _BARE_URL.match(s, i)
            assert url is not None
            plain.append(url.group())
            i = url.end()
        elif c == "\\":
            if i + 1 < n and s[i + 1] in _ESCAPABLE:
                plain.append(s[i + 1])
                i += 2
            else:
                plain.append(c)
                i += 1
        elif c == "`":
            code = _CODE_SPAN.match(s, i, min(n, i + _LOOKAHEAD))
            if code:
                body = code.group(2)
                if len(body) > 2 and body[0] == body[-1] == " " and body.strip():
                    body = body[1:-1]
                emit(f"<code>{_text(body)}</code>")
                i = code.end()
            else:
                run = _BACKTICKS.match(s, i)
                assert run is not None
                plain.append(run.group())
                i = run.end()
        elif c == "[":
            link = _LINK.match(s, i, min(n, i + _LOOKAHEAD)) if links else None
            if link:
                label = _inline(link.group(1), links=False, depth=depth + 1)
                url = link.group(2)
                emit(f'<a href="{_attr(url)}">{label}</a>' if _safe_url(url) else label)
                i = link.end()
            else:
                plain.append(c)
                i += 1
        else:
            for tag, pattern, at_boundary in _EMPHASIS[c]:
                if at_boundary and prev.isalnum():
                    continue
                span = pattern.match(s, i, min(n, i + _LOOKAHEAD))
                if span:
                    emit(f"<{tag}>{_inline(span.group(1), links, depth + 1)}</{tag}>")
                    i = span.end()
                    break
            else:
                plain.append(c)
                i += 1
    out.append(_text("".join(plain)))
    return "".join(out)


def _line(line: str) -> str:
    if heading := _HEADING.fullmatch(line):
        title = heading.group(1)
        return f"<b>{_inline(title)}</b>" if title.strip() else ""
    if bullet := _BULLET.fullmatch(line):
        return f"{_text(bullet.group(1))}• {_inline(bullet.group(2))}"
    return _inline(line)


def _code_block(body: str, info: str) -> str:
    body = body.rstrip("\n")
    if not body.strip():
        return ""
    words = info.split()
    if words and _LANGUAGE.fullmatch(words[0]):
        return (
            f'<pre><code class="language-{_attr(words[0])}">{_text(body)}</code></pre>'
        )
    return f"<pre>{_text(body)}</pre>"


def to_html(markdown: str) -> str:
    """Agent Markdown to Telegram HTML: paragraphs, emphasis, code, fences, safe links, quotes.

    Lines stay lines (Telegram renders newlines); runs of blank lines collapse to one. Bullets
    become "• item"; "#" headings become bold lines. A fence without a closing ``` runs to the end.
    """
    lines = lines_of(markdown)
    blocks: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if fence := _FENCE_OPEN.fullmatch(line):
            ticks = len(fence.group(1))
            body: list[str] = []
            i += 1
            while i < len(lines):
                close = _FENCE_CLOSE.fullmatch(lines[i])
                if close and len(close.group(1)) >= ticks:
                    break
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence (or past the end)
            blocks.append(_code_block("\n".join(body), fence.group(2)))
        elif _QUOTE.fullmatch(line):
            quoted: list[str] = []
            while i < len(lines) and (quote := _QUOTE.fullmatch(lines[i])):
                quoted.append(_line(quote.group(1)))
                i += 1
            content = "\n".join(quoted).strip("\n")
            blocks.append(
                f"<blockquote>{content}</blockquote>" if content.strip() else ""
            )
        else:
            blocks.append(_line(line))
            i += 1
    return collapse_blank(blocks)


# --- Splitting --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Atom:
    """An indivisible piece: one character, one entity, or one tag (open tags know their closer)."""

    kind: str  # "text" | "open" | "close"
    raw: str
    size: int  # UTF-16 units of raw
    pair: int = -1  # links an open tag to its close tag
    closer: str = ""  # for open tags: "</name>"


@dataclass(frozen=True, slots=True)
class _Break:
    at: int  # atom index where the whitespace run starts
    pieces: int  # how many chunk pieces come before it
    used: int  # part size at that point (without closers)
    stack: tuple[_Atom, ...]


_HTML_TOKEN = re.compile(
    r"<[^<>]*>|&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,9});"
)
_TAG_NAME = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)")
_TAG = re.compile(r"<[^<>]*>")
_SPACES = frozenset(" \t\n")


def _char_atoms(text: str) -> list[_Atom]:
    return [_Atom("text", ch, utf16_len(ch)) for ch in text]


def _html_atoms(markup: str) -> list[_Atom]:
    atoms: list[_Atom] = []
    open_tags: list[tuple[str, int]] = []
    pos = 0
    for m in _HTML_TOKEN.finditer(markup):
        atoms += _char_atoms(markup[pos : m.start()])
        pos = m.end()
        token = m.group()
        if token[0] == "&":
            atoms.append(_Atom("text", token, utf16_len(token)))
            continue
        tag = _TAG_NAME.match(token)
        if tag is None or token.endswith("/>"):
            atoms += _char_atoms(token)  # not a tag Telegram knows: keep it as it was
            continue
        name = tag.group(2).lower()
        if not tag.group(1):
            pair = len(atoms)
            open_tags.append((name, pair))
            closer = f"</{name}>"
            atoms.append(_Atom("open", token, utf16_len(token), pair, closer))
        elif open_tags and open_tags[-1][0] == name:
            atoms.append(_Atom("close", token, utf16_len(token), open_tags.pop()[1]))
        # an unmatched close tag is dropped
    atoms += _char_atoms(markup[pos:])
    return atoms


def _overhead(stack: list[_Atom] | tuple[_Atom, ...]) -> int:
    return sum(a.size + utf16_len(a.closer) for a in stack)


def _closers(stack: list[_Atom] | tuple[_Atom, ...]) -> str:
    return "".join(a.closer for a in reversed(stack))


def _is_space(atom: _Atom) -> bool:
    return atom.kind == "text" and atom.raw in _SPACES


def _space_run_end(atoms: list[_Atom], at: int) -> int:
    while at < len(atoms) and _is_space(atoms[at]):
        at += 1
    return at


def _priority(atoms: list[_Atom], brk: _Break) -> int:
    run = "".join(a.raw for a in atoms[brk.at : _space_run_end(atoms, brk.at)])
    return 2 if run.count("\n") >= 2 else 1 if "\n" in run else 0


def _choose(atoms: list[_Atom], breaks: list[_Break], used: int) -> _Break | None:
    """Paragraph break, then line break, then space, among those in the part's second half."""
    for priority in (2, 1, 0):
        for brk in reversed(breaks):
            if brk.used * 2 >= used and _priority(atoms, brk) == priority:
                return brk
    return breaks[-1] if breaks else None


def _split_atoms(atoms: list[_Atom], limit: int) -> list[str]:
    if limit < _MIN_LIMIT:
        raise ValueError(f"limit must be at least {_MIN_LIMIT}, got {limit}")
    parts: list[str] = []
    skipped: set[int] = (
        set()
    )  # tag pairs too large to carry: their text is kept, the tags dropped
    stack: list[_Atom] = []  # invariant: _overhead(stack) + _ATOM_MARGIN <= limit
    i = 0
    while i < len(atoms):
        start = i
        chunk = [a.raw for a in stack]
        used = sum(a.size for a in stack)
        closing = _overhead(stack) - used
        has_text = False
        breaks: list[_Break] = []
        full = False
        while i < len(atoms):
            a = atoms[i]
            if a.kind == "close":
                if a.pair not in skipped:
                    chunk.append(a.raw)
                    used += a.size
                    closing -= utf16_len(stack.pop().closer)
                i += 1
                continue
            if a.kind == "open":
                cost = a.size + utf16_len(a.closer)
                if _overhead(stack) + cost + _ATOM_MARGIN > limit:
                    skipped.add(a.pair)
                    i += 1
                    continue
                if used + closing + cost > limit:
                    full = True
                    break
                chunk.append(a.raw)
                stack.append(a)
                used += a.size
                closing += utf16_len(a.closer)
                i += 1
                continue
            space = a.raw in _SPACES
            if space and has_text and not _is_space(atoms[i - 1]):
                breaks.append(_Break(i, len(chunk), used, tuple(stack)))
            if used + closing + a.size > limit:
                full = True
                break
            chunk.append(a.raw)
            used += a.size
            has_text = has_text or not space
            i += 1
        brk = _choose(atoms, breaks, used) if full else None
        if brk is not None:
            parts.append("".join(chunk[: brk.pieces]) + _closers(brk.stack))
            stack = list(brk.stack)
            i = _space_run_end(atoms, brk.at)
        else:
            parts.append("".join(chunk) + _closers(stack))
        assert i > start, "split made no progress"
    return [p for p in parts if to_plain(p).strip()]


def split_html(html_text: str, limit: int = TELEGRAM_TEXT_LIMIT) -> list[str]:
    """Split Telegram HTML into parts of at most `limit` UTF-16 units, each valid on its own.

    Breaks prefer a blank line, then a newline, then a space (dropping that whitespace), else
    fall between two characters. Tags and entities are never cut; tags open at a break are closed
    at the end of the part and reopened, attributes and all, at the start of the next. A tag pair
    too large to repeat within `limit` is dropped and its text kept. Whitespace-only parts are
    left out, so the empty string gives [].
    """
    return _split_atoms(_html_atoms(html_text), limit)


def to_plain(html_text: str) -> str:
    """Telegram HTML to plain text (strip tags, unescape entities): the fallback after a 400
    "can't parse entities" reply."""
    return html.unescape(_TAG.sub("", html_text))


def split_plain(text: str, limit: int = TELEGRAM_TEXT_LIMIT) -> list[str]:
    """Split plain text into parts of at most `limit` UTF-16 units, with `split_html`'s preferences."""
    return _split_atoms(_char_atoms(text), limit)
