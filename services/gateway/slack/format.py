"""Slack text formatting: agent Markdown to mrkdwn, fence-aware splitting, and a plain reading.

Pure functions, no I/O. Facts from Slack's "Formatting text for app surfaces" and chat.postMessage:

- &, < and > are Slack's control characters. Where they are text they must be written &amp; &lt;
  &gt;, and only those three entities are decoded, so nothing else is escaped. Code is no exception.
- Links are <url> and <url|text>; <@U123> names a user, <#C123> a channel, <!subteam^S123> a user
  group; <!here>, <!channel> and <!everyone> notify whole channels.
- mrkdwn has *bold*, _italic_, ~strike~, `code`, ```blocks``` (no language) and "> " quotes at a
  line start. It has no headings and no list syntax (lists are plain lines), and no way to escape
  * _ ~ or a backtick: a backslash stays a backslash.
- chat.postMessage truncates `text` past 40,000 characters, and Slack asks for much shorter
  messages (about 4,000 for display). `split_mrkdwn` cuts at DEFAULT_PART_LIMIT (3,500) and counts
  UTF-16 code units, never fewer than characters, so a part fits however Slack counts.

Decisions:
- Slack syntax the agent writes itself is escaped (shown, never acted on) unless a flag allows
  it: `mentions=True` passes <@U…>/<@W…> and <#C…>/<#G…> through, `broadcasts=True` passes
  <!here>, <!channel>, <!everyone> and <!subteam^S…>. So an agent cannot notify a channel by
  accident.
- Emphasis markers are written only where Slack pairs them: round content with no space at either
  end and none of the same marker inside, with no letter, digit or marker (* _ ~) just outside.
  Otherwise the text is written without that emphasis, never with a lone marker. A * _ or ~ the
  Markdown itself leaves unpaired is written as it is: Slack has no escape for it, and ignores it
  inside words (2*3*4, snake_case).
- Three or more backticks in a row, which Slack reads as a code fence that swallows the rest of the
  message, get a zero-width space (U+200B) after every second backtick wherever they are literal
  (text, inline code, code block bodies). That is the only character `to_mrkdwn` ever adds.
- Link text is written plain (no markup inside <url|text>), with "|" as "｜" (U+FF5C), so it cannot
  end the URL early; "<" and ">" in it are escaped like any text.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Final

from services.gateway.text import (
    BACKTICKS,
    BULLET,
    CODE_SPAN,
    EMPHASIS,
    ESCAPABLE,
    FENCE_CLOSE,
    FENCE_OPEN,
    HEADING,
    LINK,
    QUOTE,
    collapse_blank,
    lines_of,
    safe_url,
    utf16_len,
)

SLACK_TEXT_LIMIT: Final = 40_000  # chat.postMessage truncates `text` beyond this
DEFAULT_PART_LIMIT: Final = (
    3_500  # below the ~4,000 Slack asks for, with room for fences
)
LINK_SCHEMES: Final = frozenset({"http", "https", "mailto"})

_MARKS: Final = {"bold": "*", "italic": "_", "strike": "~"}
_MAX_NESTING: Final = (
    8  # deeper inline markup is written as text (keeps recursion bounded)
)
_MAX_SPAN: Final = (
    1_000  # emphasis is looked for this far ahead (else unclosed markers cost n²)
)
_ZWSP: Final = "\u200b"


def escape(text: str) -> str:
    """`&`, `<` and `>` as `&amp;`, `&lt;`, `&gt;`: all the escaping Slack needs or decodes."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# --- Markdown to mrkdwn -----------------------------------------------------------------------

_FENCE_RUN = re.compile(r"`{3,}")
_SPECIAL = re.compile(r"[\\`*_~\[<]|(?<![\w/])https?://")
_BARE_URL = re.compile(r"https?://[^\s<>\"|`]+")
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^\s<>|`]+)>")
_USER_REF = re.compile(r"<(?:@[UW]|#[CG])[A-Z0-9]{2,}(?:\|[^<>|&\n]*)?>")
_BROADCAST = re.compile(
    r"<!(?:here|channel|everyone|subteam\^S[A-Z0-9]{2,})(?:\|[^<>|&\n]*)?>"
)
_TOKEN = re.compile(r"<[^<>\n]*>")
_URL_TRAILING: Final = frozenset(".,:;!?'\"*_~")


@dataclass(frozen=True, slots=True)
class _Allow:
    mentions: bool
    broadcasts: bool


def _defuse(text: str) -> str:
    """Break runs of three or more backticks with U+200B so Slack never reads a code fence there."""
    return _FENCE_RUN.sub(lambda m: _ZWSP.join(re.findall("``?", m.group())), text)


def _text(s: str) -> str:
    return _defuse(escape(s))


def _url(url: str) -> str:
    """A URL inside <...>: & escaped; <, >, | and ` percent-encoded so the link cannot end early."""
    url = (
        url.replace("<", "%3C")
        .replace(">", "%3E")
        .replace("|", "%7C")
        .replace("`", "%60")
    )
    return url.replace("&", "&amp;")


def _trim_url(url: str) -> str:
    """A bare URL without the sentence punctuation after it (and without an unbalanced ")")."""
    while url:
        if url[-1] in _URL_TRAILING:
            url = url[:-1]
        elif url[-1] == ")" and url.count(")") > url.count("("):
            url = url[:-1]
        else:
            break
    return url


def _touches(ch: str) -> bool:
    """A letter, digit or marker next to a marker keeps Slack from reading it as one."""
    return ch.isalnum() or (ch != "" and ch in "*_~")


def _wrap(mark: str, content: str, before: str, after: str) -> str:
    """`mark` + content + `mark` where Slack will pair the two markers, else just the content."""
    if (
        content.strip()
        and not content[0].isspace()
        and not content[-1].isspace()
        and mark not in _TOKEN.sub("", content)
        and not _touches(before)
        and not _touches(after)
    ):
        return f"{mark}{content}{mark}"
    return content


def _inline(
    s: str,
    allow: _Allow,
    before: str = "",
    after: str = "",
    plain: bool = False,
    links: bool = True,
    depth: int = 0,
) -> str:
    """One line of inline Markdown to mrkdwn; `before`/`after` are the characters around it.

    With `plain`, emphasis and code lose their markers and nothing becomes a link or mention.
    """
    if depth > _MAX_NESTING:
        return _text(s)
    out: list[str] = []
    buf: list[str] = []

    def emit(markup: str) -> None:
        out.append(_text("".join(buf)))
        buf.clear()
        out.append(markup)

    def last() -> str:
        for piece in reversed(buf):
            if piece:
                return piece[-1]
        for piece in reversed(out):
            if piece:
                return piece[-1]
        return before

    i, n = 0, len(s)
    while i < n:
        m = _SPECIAL.search(s, i)
        if m is None:
            buf.append(s[i:])
            break
        buf.append(s[i : m.start()])
        i = m.start()
        c = s[i]
        if len(m.group()) > 1:  # a bare URL: its _ and * are not emphasis
            found = _BARE_URL.match(s, i)
            assert found is not None
            url = _trim_url(found.group())
            if plain or not safe_url(url, LINK_SCHEMES):
                url = found.group()
                buf.append(url)
            else:
                emit(f"<{_url(url)}>")
            i += len(url)
        elif c == "\\":
            if i + 1 < n and s[i + 1] in ESCAPABLE:
                buf.append(s[i + 1])
                i += 2
            else:
                buf.append(c)
                i += 1
        elif c == "`":
            code = CODE_SPAN.match(s, i)
            if code:
                body = code.group(2)
                if len(body) > 2 and body[0] == body[-1] == " " and body.strip():
                    body = body[1:-1]
                if plain or "`" in body:  # mrkdwn code spans cannot hold a backtick
                    buf.append(body)
                else:
                    emit(f"`{_text(body)}`")
                i = code.end()
            else:
                run = BACKTICKS.match(s, i)
                assert run is not None
                buf.append(run.group())
                i = run.end()
        elif c == "[":
            link = LINK.match(s, i) if links else None
            if link:
                url = link.group(2)
                nxt = s[link.end()] if link.end() < n else after
                if safe_url(url, LINK_SCHEMES):
                    label = _inline(
                        link.group(1), allow, plain=True, links=False, depth=depth + 1
                    )
                    label = label.strip().replace("|", "\uff5c")
                    emit(f"<{_url(url)}|{label}>" if label else f"<{_url(url)}>")
                else:
                    emit(
                        _inline(
                            link.group(1), allow, last(), nxt, plain, False, depth + 1
                        )
                    )
                i = link.end()
            else:
                buf.append(c)
                i += 1
        elif c == "<":
            ref = None
            if not plain and allow.mentions:
                ref = _USER_REF.match(s, i)
            if not plain and allow.broadcasts and ref is None:
                ref = _BROADCAST.match(s, i)
            auto = None if plain or ref else _AUTOLINK.match(s, i)
            if ref:
                emit(ref.group())
                i = ref.end()
            elif auto and safe_url(auto.group(1), LINK_SCHEMES):
                emit(f"<{_url(auto.group(1))}>")
                i = auto.end()
            else:
                buf.append(c)
                i += 1
        else:
            prev = s[i - 1] if i else before
            for style, pattern, at_boundary in EMPHASIS[c]:
                if at_boundary and prev.isalnum():
                    continue
                span = pattern.match(s, i, min(n, i + _MAX_SPAN))
                if span:
                    end = span.end()
                    nxt = s[end] if end < n else after
                    if nxt == "\\" and end + 1 < n:
                        nxt = s[end + 1]
                    outside = last()
                    inner = _inline(
                        span.group(1), allow, outside, nxt, plain, links, depth + 1
                    )
                    emit(inner if plain else _wrap(_MARKS[style], inner, outside, nxt))
                    i = end
                    break
            else:
                buf.append(c)
                i += 1
    out.append(_text("".join(buf)))
    return "".join(out)


def _line(line: str, allow: _Allow) -> str:
    """One line outside code; defused once more as a whole, as backticks from separately written
    pieces (a span's text and the text after it) may meet."""
    if heading := HEADING.fullmatch(line):
        title = _inline(heading.group(1), allow)
        return _defuse(_wrap("*", title, "", "")) if title.strip() else ""
    if bullet := BULLET.fullmatch(line):
        return _defuse(
            f"{bullet.group(1)}• {_inline(bullet.group(2), allow, before=' ')}"
        )
    return _defuse(_inline(line, allow))


def _code_block(body: str) -> str:
    body = body.rstrip("\n")
    return f"```\n{_text(body)}\n```" if body.strip() else ""


def to_mrkdwn(
    markdown: str, *, mentions: bool = False, broadcasts: bool = False
) -> str:
    """Agent Markdown to Slack mrkdwn: emphasis, code, fences, safe links, quotes, lists, headings.

    Lines stay lines; runs of blank lines collapse to one. "#" headings become bold lines, bullets
    "• item", numbered lists stay as written. Fences lose their language (mrkdwn has no
    highlighting) and a fence without a closing ``` runs to the end. Only http(s) and mailto
    links become links; others (javascript:, data:, file:, relative) are written as their text.
    <@U…>/<#C…> mentions pass through only with `mentions`, <!here>/<!channel>/<!everyone>/
    <!subteam^…> only with `broadcasts`; otherwise they are escaped and shown as written.
    """
    allow = _Allow(mentions, broadcasts)
    lines = lines_of(markdown)
    blocks: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if fence := FENCE_OPEN.fullmatch(line):
            ticks = len(fence.group(1))
            body: list[str] = []
            i += 1
            while i < len(lines):
                close = FENCE_CLOSE.fullmatch(lines[i])
                if close and len(close.group(1)) >= ticks:
                    break
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence (or past the end)
            blocks.append(_code_block("\n".join(body)))
        elif QUOTE.fullmatch(line):
            quoted: list[str] = []
            while i < len(lines) and (quote := QUOTE.fullmatch(lines[i])):
                rendered = _line(quote.group(1), allow)
                if rendered.strip():  # a "> " line alone may show as a literal ">"
                    quoted.append(f"> {rendered}")
                i += 1
            blocks.append("\n".join(quoted))
        else:
            blocks.append(_line(line, allow))
            i += 1
    return collapse_blank(blocks)


# --- Reading mrkdwn: which markers Slack pairs ------------------------------------------------

# `code`: no other backtick touching either end, no space just inside (so a split's added ` can
# never meet another backtick and make a fence)
_CODE_PAIR_RE: Final = r"(?<!`)`[^`\s](?:[^`\n]*[^`\s])?`(?!`)"
_CODE_PAIR = re.compile(_CODE_PAIR_RE)
_HIDDEN: Final = (
    "\ufffc"  # stands for a <...> token or entity: never a word character or marker
)


def _pairs(line: str) -> list[tuple[int, int, str]]:
    """The (open, close, marker) pairs Slack formats in one line, outermost first.

    Code spans first (`...`, see _CODE_PAIR); then * _ ~ outside them, read left to right: a
    marker opens with no letter, digit or like marker before it and no space after; it closes with
    no space before and no letter, digit or like marker after, pairing with the open marker of its
    kind. One marker of a kind is open at a time, and a close drops opens made after its own
    opener, so pairs nest and never cross: at most four (` * _ ~) are open anywhere.
    """
    found = [(m.start(), m.end() - 1, "`") for m in _CODE_PAIR.finditer(line)]
    chars = list(line)
    for o, c, _ in found:
        chars[o : c + 1] = _HIDDEN * (c + 1 - o)
    stack: list[tuple[str, int]] = []
    last = len(chars) - 1
    for p, ch in enumerate(chars):
        if ch not in "*_~":
            continue
        before = chars[p - 1] if p else " "
        after = chars[p + 1] if p < last else " "
        if (
            not before.isspace()
            and before != ch
            and not after.isalnum()
            and after != ch
        ):
            opened = next((k for k, (mark, _) in enumerate(stack) if mark == ch), None)
            if opened is not None:
                found.append((stack[opened][1], p, ch))
                del stack[opened:]
                continue
        if (
            not before.isalnum()
            and before != ch
            and not after.isspace()
            and after != ch
        ):
            if all(mark != ch for mark, _ in stack):
                stack.append((ch, p))
    return sorted(found, key=lambda f: (f[0], -f[1]))


# --- Splitting --------------------------------------------------------------------------------

_FENCE: Final = "```"
_REOPEN: Final = "```\n"  # starts a part that continues a code block
_CLOSE: Final = "\n```"  # ends a part that leaves a code block open
_QUOTE_MARK: Final = "> "  # starts a part that continues a quoted line
_OVERHEAD: Final = (
    10  # the most a part adds round its text: "> " and four markers, four closers
)
_MIN_LIMIT: Final = 32  # that overhead plus the largest atom that is never cut (16)
_MAX_CLUSTER: Final = (
    8  # code points kept together (a character and its marks, an emoji sequence)
)
_SPLIT_TOKEN = re.compile(
    r"<[^<>\n]*>|&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,9});|```"
)
_SPACES: Final = frozenset(" \t\n")
_ZWJ: Final = "\u200d"


@dataclass(frozen=True, slots=True)
class _Atom:
    """A piece never cut: a character cluster, an entity, a <...> token, a fence, or one space."""

    kind: str  # "text" | "space" | "fence"
    raw: str
    size: int  # UTF-16 units of raw


@dataclass(frozen=True, slots=True)
class _Break:
    at: int  # atom index of the whitespace where the part may end
    pieces: int  # chunk pieces before it
    used: int  # part size at that point (without closing markers)
    code: bool  # inside a code block there
    spans: tuple[str, ...]  # markers open there, outermost first


def _regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _joins(cluster: str, ch: str) -> bool:
    """Whether `ch` belongs with the characters before it: a mark, joiner, modifier, flag half."""
    if cluster[-1] == _ZWJ:
        return True
    if _regional(ch):
        return len(cluster) == 1 and _regional(cluster)
    cp = ord(ch)
    return (
        ch == _ZWJ
        or unicodedata.category(ch) in ("Mn", "Mc", "Me")
        or 0xFE00 <= cp <= 0xFE0F  # variation selectors
        or 0x1F3FB <= cp <= 0x1F3FF  # skin tones
        or 0xE0020 <= cp <= 0xE007F  # emoji tag sequences
        or 0xE0100 <= cp <= 0xE01EF
    )


def _char_atoms(text: str, atoms: list[_Atom]) -> None:
    cluster = ""
    for ch in text:
        if ch in _SPACES:
            if cluster:
                atoms.append(_Atom("text", cluster, utf16_len(cluster)))
                cluster = ""
            atoms.append(_Atom("space", ch, 1))
        elif cluster and len(cluster) < _MAX_CLUSTER and _joins(cluster, ch):
            cluster += ch
        else:
            if cluster:
                atoms.append(_Atom("text", cluster, utf16_len(cluster)))
            cluster = ch
    if cluster:
        atoms.append(_Atom("text", cluster, utf16_len(cluster)))


def _atoms(text: str, largest: int) -> list[_Atom]:
    atoms: list[_Atom] = []
    pos = 0
    for m in _SPLIT_TOKEN.finditer(text):
        _char_atoms(text[pos : m.start()], atoms)
        pos = m.end()
        token = m.group()
        if token == _FENCE:
            atoms.append(_Atom("fence", token, len(token)))
        elif token[0] == "&" or utf16_len(token) <= largest:
            atoms.append(_Atom("text", token, utf16_len(token)))
        else:  # a link longer than any part: shown as the text it is
            atoms += _atoms(f"&lt;{token[1:-1]}&gt;", largest)
    _char_atoms(text[pos:], atoms)
    return atoms


def _space_run_end(atoms: list[_Atom], at: int) -> int:
    while at < len(atoms) and atoms[at].kind == "space":
        at += 1
    return at


def _priority(atoms: list[_Atom], brk: _Break) -> int:
    if brk.code:
        return 1
    run = atoms[brk.at : _space_run_end(atoms, brk.at)]
    newlines = sum(a.raw == "\n" for a in run)
    return 2 if newlines >= 2 else 1 if newlines else 0


def _choose(atoms: list[_Atom], breaks: list[_Break], used: int) -> _Break | None:
    """Paragraph break, then line break, then space, among those in the part's second half."""
    for priority in (2, 1, 0):
        for brk in reversed(breaks):
            if brk.used * 2 >= used and _priority(atoms, brk) == priority:
                return brk
    return breaks[-1] if breaks else None


def _code_map(atoms: list[_Atom]) -> tuple[list[bool], list[bool]]:
    """Per atom: inside a code block before it; and, for a space, whether a fence comes next."""
    inside = [False]
    for a in atoms:
        inside.append(inside[-1] != (a.kind == "fence"))
    fence_next = [False] * len(atoms)
    following = False
    for j in range(len(atoms) - 1, -1, -1):
        if atoms[j].kind == "space":
            fence_next[j] = following
        else:
            following = atoms[j].kind == "fence"
    return inside, fence_next


def _mask(atom: _Atom) -> str:
    """One character standing for an atom, as `_pairs` reads it."""
    if atom.kind == "text" and len(atom.raw) > 1 and atom.raw[0] in "<&":
        return _HIDDEN
    return atom.raw[0]


@dataclass(frozen=True, slots=True)
class _Spans:
    """What is open before each atom outside code, as `_pairs` and the quote rule read the lines."""

    open: list[tuple[str, ...]]  # markers open before atom k, outermost first
    quoted: list[bool]  # atom k continues a "> " quoted line
    opens: list[bool]  # atom k opens a span, a code block or a quote
    quote_space: list[bool]  # atom k is the space of a "> " quote marker


def _span_map(atoms: list[_Atom], inside: list[bool]) -> _Spans:
    n = len(atoms)
    spans = _Spans([()] * (n + 1), [False] * (n + 1), [False] * n, [False] * n)
    for k, a in enumerate(atoms):
        spans.opens[k] = a.kind == "fence" and inside[k + 1]
    line: list[int] = []

    def read() -> None:
        if len(line) > 2 and atoms[line[0]].raw == ">" and atoms[line[1]].raw == " ":
            spans.opens[line[0]] = spans.quote_space[line[1]] = True
            for k in line[2:]:
                spans.quoted[k] = True
        for o, c, mark in _pairs("".join(_mask(atoms[k]) for k in line)):
            spans.opens[line[o]] = True
            for k in line[o + 1 : c + 1]:
                spans.open[k] += (mark,)
        line.clear()

    for k, a in enumerate(atoms):
        if inside[k] or a.kind == "fence" or a.raw == "\n":
            read()
        else:
            line.append(k)
    read()
    return spans


def _back_off(
    atoms: list[_Atom], index: list[int], opens: list[bool], chunk: list[str]
) -> int:
    """How many pieces to keep at a hard break: a part does not end on an opening marker or fence
    (or on one and the whitespace after it), unless that would leave it empty."""
    k = len(chunk)
    while k and atoms[index[k - 1]].kind == "space":
        k -= 1
    if not (k and opens[index[k - 1]]):
        return len(chunk)
    while k and opens[index[k - 1]]:
        k -= 1
    return k if "".join(chunk[:k]).strip() else len(chunk)


def split_mrkdwn(text: str, limit: int = DEFAULT_PART_LIMIT) -> list[str]:
    """Split mrkdwn into parts of at most `limit` UTF-16 units, each one rendering on its own.

    Breaks prefer a blank line, then a newline, then a space (dropping that whitespace), in the
    second half of a part; else they fall between two characters. <...> links and mentions, &amp;
    entities and character clusters (a letter and its accents, an emoji sequence) are never cut.
    A code block open at a break is closed with "\n```" and reopened with "```\n" in the next
    part; inside code a break takes only a newline (indentation stays), and never leaves a block
    without text. *bold*, _italic_, ~strike~ and `code` spans open at a break are closed and
    reopened the same way, and a "> " quoted line cut in two is quoted again. A code block still
    open at the end is closed. A link too long for any part is written as escaped text.
    Whitespace-only parts are left out, so "" gives [].
    """
    return ["".join(part) for part in _split_parts(text, limit)]


def _split_parts(text: str, limit: int) -> list[tuple[str, str, str]]:
    """`split_mrkdwn`'s parts as (added before, the text carried, added after)."""
    if limit < _MIN_LIMIT:
        raise ValueError(f"limit must be at least {_MIN_LIMIT}, got {limit}")
    atoms = _atoms(text, limit - _OVERHEAD)
    inside, fence_next = _code_map(atoms)
    spans = _span_map(atoms, inside)
    parts: list[tuple[str, str, str]] = []
    i = 0
    while i < len(atoms):
        start = i
        if inside[i]:
            head = _REOPEN
        else:
            head = (_QUOTE_MARK if spans.quoted[i] else "") + "".join(spans.open[i])
        chunk: list[str] = []
        index: list[int] = []  # the atom behind each piece of chunk
        used = len(head)
        has_text = False
        code_text = (
            False  # code other than whitespace since the block (re)opened in this part
        )
        breaks: list[_Break] = []
        full = False
        while i < len(atoms):
            a, code = atoms[i], inside[i]
            if a.kind == "space" and has_text:
                if not code:
                    if atoms[i - 1].kind != "space" and not spans.quote_space[i]:
                        breaks.append(_Break(i, len(chunk), used, False, spans.open[i]))
                elif a.raw == "\n" and code_text and not fence_next[i]:
                    breaks.append(_Break(i, len(chunk), used, True, ()))
            if a.kind == "space" and code and fence_next[i]:
                # whitespace before a closing fence needs room only for that fence; if even that
                # is short, it goes, bar one newline (the room "\n```" kept before it is enough)
                if used + a.size + len(_FENCE) > limit:
                    run = i
                    while run > start and atoms[run - 1].kind == "space":
                        run -= 1
                    while index and index[-1] >= run:
                        used -= atoms[index.pop()].size
                        chunk.pop()
                    while atoms[i].kind == "space":
                        i += 1
                    newline = next(
                        (k for k in range(run, i) if atoms[k].raw == "\n"), None
                    )
                    if newline is not None:
                        chunk.append("\n")
                        index.append(newline)
                        used += 1
                    continue
            else:
                closing = len(_CLOSE) if inside[i + 1] else len(spans.open[i + 1])
                if used + a.size + closing > limit:
                    full = True
                    break
            chunk.append(a.raw)
            index.append(i)
            used += a.size
            if a.kind == "fence":
                code_text = False
            elif code and a.kind != "space":
                code_text = True
            has_text = has_text or a.kind != "space"
            i += 1
        brk = _choose(atoms, breaks, used) if full else None
        if brk is not None:
            pieces, code, open_spans = brk.pieces, brk.code, brk.spans
            i = brk.at + 1 if brk.code else _space_run_end(atoms, brk.at)
        else:
            pieces = _back_off(atoms, index, spans.opens, chunk) if full else len(chunk)
            if pieces < len(chunk):
                i = index[pieces]
            code, open_spans = inside[i], spans.open[i]
        content = "".join(chunk[:pieces])
        if content.strip():
            parts.append(
                (head, content, _CLOSE if code else "".join(reversed(open_spans)))
            )
        assert i > start, "split made no progress"
    return parts


# --- Plain reading ----------------------------------------------------------------------------

_PLACEHOLDER: Final = "\ufffc"
_PLACEHOLDER_RE = re.compile(_PLACEHOLDER)
_PLAIN_HOLD = re.compile(rf"<[^<>\n]*>|{_CODE_PAIR_RE}|\ufffc")
_ADDED_ZWSP = re.compile(r"(?<=`)\u200b(?=`)")


def _unescape(text: str) -> str:
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _token_text(token: str) -> str:
    """What a reader sees for a <...> token: a link as "text (url)", a mention as @name or #name."""
    target, _, label = token[1:-1].partition("|")
    if target.startswith("@"):
        return "@" + (label.lstrip("@") or target[1:])
    if target.startswith("#"):
        return "#" + (label.lstrip("#") or target[1:])
    if target.startswith("!"):
        return label or "@" + target[1:].split("^")[0]
    url = _unescape(target)
    label = _unescape(label)
    return f"{label} ({url})" if label and label != url else url


def _plain_prose(text: str) -> str:
    held: list[str] = []

    def hold(m: re.Match[str]) -> str:
        token = m.group()
        if token == _PLACEHOLDER:
            held.append(token)
        elif token[0] == "`":
            held.append(_unescape(token[1:-1]))
        else:
            held.append(_token_text(token))
        return _PLACEHOLDER

    lines = []
    for line in text.split("\n"):
        chars = list(_PLAIN_HOLD.sub(hold, line))
        for o, c, _ in _pairs("".join(chars)):
            chars[o] = chars[c] = ""
        lines.append(_unescape("".join(chars)))
    pieces = iter(held)
    return _PLACEHOLDER_RE.sub(lambda _: next(pieces), "\n".join(lines))


def to_plain(mrkdwn: str) -> str:
    """What a reader sees in mrkdwn, as plain text: for previews, logs and notification fallbacks.

    Paired markers and fences go, entities are decoded, <url|text> reads "text (url)", mentions
    read @name / #name. The result is not escaped: pass it through `escape` before sending it.
    """
    out: list[str] = []
    for n, segment in enumerate(mrkdwn.split(_FENCE)):
        segment = _ADDED_ZWSP.sub("", segment)
        if n % 2:  # inside a code block (an unclosed fence runs to the end)
            body = segment.removeprefix("\n").removesuffix("\n")
            out.append(_unescape(body))
        else:
            out.append(_plain_prose(segment))
    return "".join(out)
