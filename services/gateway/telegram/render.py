"""Telegram's renderer: the agent's Markdown as Telegram HTML, read into atoms for the splitter, and plain.

Facts from the Bot API "Formatting options" section:

- sendMessage text is 1-4096 characters after entities parsing, counted in UTF-16 code units.
  `split_html` measures the HTML itself (tags included), which is never shorter, so parts always fit.
- HTML mode supports b/strong, i/em, u/ins, s/strike/del, tg-spoiler, a href, code, pre,
  pre > code class="language-x" and blockquote [expandable]. `to_html` emits only
  b, i, s, code, pre, a and blockquote.
- Every <, > and & that is not markup must be written &lt; &gt; &amp;; only those named entities
  and &quot; (plus numeric entities) are understood.

What the model does not recognise comes out as escaped text, and every tag `to_html` writes is
opened and closed by the same call, so its output is always balanced.
"""

from __future__ import annotations

import re
from typing import Final

from services.gateway.markup import model as md
from services.gateway.markup.split import ENTITY, Atom, split_text, text_atoms, tokens, utf16_len

TELEGRAM_TEXT_LIMIT: Final = 4096
LINK_SCHEMES: Final = frozenset({"http", "https", "tg", "mailto"})
_TAGS: Final = {"bold": "b", "italic": "i", "strike": "s"}


def _escape(s: str, quote: bool = True) -> str:
    """What html.escape does. The html module (with html.entities, ~0.3 MB of RSS) is imported where entities
    are unescaped (to_plain, at the first send), not when the gateway starts."""
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s.replace('"', "&quot;").replace("'", "&#x27;") if quote else s


def _text(s: str) -> str:
    return _escape(s, quote=False)


def _span(span: md.Inline) -> str:
    if isinstance(span, md.Code):
        return f"<code>{_text(span.text)}</code>"
    if isinstance(span, md.Emphasis):
        tag = _TAGS[span.style]
        return f"<{tag}>{_spans(span.children)}</{tag}>"
    if isinstance(span, md.Link):
        label = _spans(span.children)
        if md.safe_url(span.url, LINK_SCHEMES):
            return f'<a href="{_escape(span.url, quote=True)}">{label}</a>'
        return label
    return _text(span.source if isinstance(span, md.Angle) else span.text)


def _spans(spans: tuple[md.Inline, ...]) -> str:
    return "".join(_span(s) for s in spans)


def _block(block: md.Block) -> str:
    if isinstance(block, md.CodeBlock):
        if not block.body.strip():
            return ""
        if block.language:
            return f'<pre><code class="language-{_escape(block.language)}">{_text(block.body)}</code></pre>'
        return f"<pre>{_text(block.body)}</pre>"
    if isinstance(block, md.Quote):
        content = "\n".join(_block(line) for line in block.lines).strip("\n")
        return f"<blockquote>{content}</blockquote>" if content.strip() else ""
    if isinstance(block, md.Heading):
        return f"<b>{_spans(block.spans)}</b>"
    if isinstance(block, md.Item):
        return f"{_text(block.indent)}• {_spans(block.spans)}"
    return _spans(block.spans)


def to_html(markdown: str) -> str:
    """Agent Markdown to Telegram HTML: paragraphs, emphasis, code, fences, safe links, quotes.

    Lines stay lines (Telegram renders newlines); runs of blank lines collapse to one. Bullets
    become "• item"; "#" headings become bold lines.
    """
    return md.collapse_blank([_block(b) for b in md.parse(markdown)])


# --- Reading HTML for the splitter ----------------------------------------------------------------

_TOKEN = re.compile(rf"<[^<>]*>|{ENTITY}")
_TAG_NAME = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9-]*)")
_TAG = re.compile(r"<[^<>]*>")


def atoms(markup: str) -> list[Atom]:
    """Telegram HTML as atoms: an entity is one, a tag an open or close atom (<pre> verbatim); a
    close tag that matches no open one is dropped, and what is not a tag Telegram knows is text."""
    open_tags: list[tuple[str, int]] = []
    count = 0

    def token(raw: str) -> list[Atom]:
        nonlocal count
        tag = _TAG_NAME.match(raw)
        if raw[0] == "&":
            return [Atom("text", raw, utf16_len(raw))]
        if tag is None or raw.endswith("/>"):
            return text_atoms(raw, utf16_len)
        name = tag.group(2).lower()
        if not tag.group(1):
            count += 1
            open_tags.append((name, count))
            return [Atom("open", raw, utf16_len(raw), count, f"</{name}>", raw, name == "pre")]
        if open_tags and open_tags[-1][0] == name:
            return [Atom("close", raw, utf16_len(raw), open_tags.pop()[1])]
        return []

    return tokens(markup, _TOKEN, utf16_len, token)


def split_html(html_text: str, limit: int = TELEGRAM_TEXT_LIMIT) -> list[str]:
    """Telegram HTML in parts of at most `limit` UTF-16 units, each valid on its own (see
    services/gateway/markup/split.py); tags open at a break are reopened, attributes and all.
    Parts with no visible text are left out, so the empty string gives []."""
    return [p for p in split_text(atoms(html_text), limit) if to_plain(p).strip()]


def to_plain(html_text: str) -> str:
    """Telegram HTML to plain text (strip tags, unescape entities): the fallback after a 400
    "can't parse entities" reply."""
    import html

    return html.unescape(_TAG.sub("", html_text))
