"""Slack's renderer: the agent's Markdown as mrkdwn, read into atoms for the splitter, and read as plain text.

Facts from Slack's "Formatting text for app surfaces" and chat.postMessage:

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
from dataclasses import dataclass
from typing import Final

from services.gateway.markup import marks
from services.gateway.markup import model as md
from services.gateway.markup.split import ENTITY, Atom, Part, split, utf16_len

SLACK_TEXT_LIMIT: Final = 40_000  # chat.postMessage truncates `text` beyond this
DEFAULT_PART_LIMIT: Final = 3_500  # below the ~4,000 Slack asks for, with room for fences
LINK_SCHEMES: Final = frozenset({"http", "https", "mailto"})

_MARKS: Final = {"bold": "*", "italic": "_", "strike": "~"}
_ZWSP: Final = "\u200b"
_FENCE_RUN = re.compile(r"`{3,}")
_TOKEN = re.compile(r"<[^<>\n]*>")


def escape(text: str) -> str:
    """`&`, `<` and `>` as `&amp;`, `&lt;`, `&gt;`: all the escaping Slack needs or decodes."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


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
    url = url.replace("<", "%3C").replace(">", "%3E").replace("|", "%7C").replace("`", "%60")
    return url.replace("&", "&amp;")


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


def _span(span: md.Inline, allow: _Allow, before: str, plain: bool) -> str:
    """One span in mrkdwn; `before` is the character written before it. With `plain`, emphasis and
    code lose their markers and nothing becomes a link or mention."""
    if isinstance(span, md.Text):
        return _text(span.text)
    if isinstance(span, md.Url):
        return _text(span.text) if plain or not md.safe_url(span.text, LINK_SCHEMES) else f"<{_url(span.text)}>"
    if isinstance(span, md.Code):  # mrkdwn code spans cannot hold a backtick
        return _text(span.text) if plain or "`" in span.text else f"`{_text(span.text)}`"
    if isinstance(span, md.Angle):
        allowed = allow.mentions if span.kind == "mention" else allow.broadcasts
        if span.kind == "autolink" and not plain and md.safe_url(span.source[1:-1], LINK_SCHEMES):
            return f"<{_url(span.source[1:-1])}>"
        return span.source if allowed and not plain and span.kind != "autolink" else _text(span.source)
    if isinstance(span, md.Link) and md.safe_url(span.url, LINK_SCHEMES):
        label = _spans(span.children, allow, plain=True).strip().replace("|", "\uff5c")
        return f"<{_url(span.url)}|{label}>" if label else f"<{_url(span.url)}>"
    inner = _spans(span.children, allow, before, plain)
    if isinstance(span, md.Link) or plain:
        return inner
    return _wrap(_MARKS[span.style], inner, before, span.after)


def _spans(spans: tuple[md.Inline, ...], allow: _Allow, before: str = "", plain: bool = False) -> str:
    out: list[str] = []
    for span in spans:
        last = next((piece[-1] for piece in reversed(out) if piece), before)
        out.append(_span(span, allow, last, plain))
    return "".join(out)


def _block(block: md.Block, allow: _Allow) -> str:
    """One block; a line is defused once more as a whole, as backticks from separately written
    pieces (a span's text and the text after it) may meet."""
    if isinstance(block, md.CodeBlock):
        return f"```\n{_text(block.body)}\n```" if block.body.strip() else ""
    if isinstance(block, md.Quote):  # a "> " line alone may show as a literal ">"
        return "\n".join(f"> {text}" for line in block.lines if (text := _block(line, allow)).strip())
    if isinstance(block, md.Heading):
        title = _spans(block.spans, allow)
        return _defuse(_wrap("*", title, "", "")) if title.strip() else ""
    if isinstance(block, md.Item):
        return _defuse(f"{block.indent}• {_spans(block.spans, allow, before=' ')}")
    return _defuse(_spans(block.spans, allow))


def to_mrkdwn(markdown: str, *, mentions: bool = False, broadcasts: bool = False) -> str:
    """Agent Markdown to Slack mrkdwn: emphasis, code, fences, safe links, quotes, lists, headings.

    Lines stay lines; runs of blank lines collapse to one. "#" headings become bold lines, bullets
    "• item", numbered lists stay as written. Fences lose their language (mrkdwn has no
    highlighting). Only http(s) and mailto links become links; others (javascript:, data:, file:,
    relative) are written as their text. <@U…>/<#C…> mentions pass through only with `mentions`,
    <!here>/<!channel>/<!everyone>/<!subteam^…> only with `broadcasts`; otherwise they are escaped
    and shown as written.
    """
    allow = _Allow(mentions, broadcasts)
    return md.collapse_blank([_block(b, allow) for b in md.parse(markdown)])


# --- Splitting ------------------------------------------------------------------------------------

_OVERHEAD: Final = 10  # the most a part adds round its text: "> " and four markers, four closers


def atoms(text: str, limit: int) -> list[Atom]:
    """mrkdwn as atoms; a <...> token too long for any part is written as the escaped text it is."""
    largest = limit - _OVERHEAD
    text = _TOKEN.sub(lambda m: m.group() if utf16_len(m.group()) <= largest else f"&lt;{m.group()[1:-1]}&gt;", text)
    return marks.atoms(text, utf16_len, rf"<[^<>\n]*>|{ENTITY}")


def split_parts(text: str, limit: int = DEFAULT_PART_LIMIT) -> list[Part]:
    return split(atoms(text, limit), limit)


def split_mrkdwn(text: str, limit: int = DEFAULT_PART_LIMIT) -> list[str]:
    """mrkdwn in parts of at most `limit` UTF-16 units, each rendering on its own (see
    services/gateway/markup/split.py): <...> links and mentions and &amp; entities are never cut; a
    code block open at a break is closed with "\\n```" and reopened with "```\\n"; *bold*, _italic_,
    ~strike~ and `code` spans open at a break are closed and reopened, and a "> " quoted line cut in
    two is quoted again. A code block still open at the end is closed. "" gives []."""
    return [str(part) for part in split_parts(text, limit)]


# --- Plain reading --------------------------------------------------------------------------------

_PLACEHOLDER_RE = re.compile(marks.HIDDEN)
_PLAIN_HOLD = re.compile(rf"<[^<>\n]*>|{marks.CODE_PAIR_RE}|{marks.HIDDEN}")
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
    url, label = _unescape(target), _unescape(label)
    return f"{label} ({url})" if label and label != url else url


def _plain_prose(text: str) -> str:
    held: list[str] = []

    def hold(m: re.Match[str]) -> str:
        token = m.group()
        if token == marks.HIDDEN:
            held.append(token)
        elif token[0] == "`":
            held.append(_unescape(token[1:-1]))
        else:
            held.append(_token_text(token))
        return marks.HIDDEN

    lines = []
    for line in text.split("\n"):
        chars = list(_PLAIN_HOLD.sub(hold, line))
        for o, c, _ in marks.pairs("".join(chars)):
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
    for n, segment in enumerate(mrkdwn.split(marks.FENCE)):
        segment = _ADDED_ZWSP.sub("", segment)
        if n % 2:  # inside a code block (an unclosed fence runs to the end)
            out.append(_unescape(segment.removeprefix("\n").removesuffix("\n")))
        else:
            out.append(_plain_prose(segment))
    return "".join(out)
