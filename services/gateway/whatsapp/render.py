"""WhatsApp's renderer: the agent's Markdown in WhatsApp's own markup, read into atoms for the splitter.

*bold*, _italic_, ~strike~, ```monospace```, `inline code`, "> " quotes and "- " lists. WhatsApp has
no escaping and no link markup: a link is written as "label (url)". A text message holds 4,096
characters."""

from __future__ import annotations

from typing import Final

from services.gateway.markup import marks
from services.gateway.markup import model as md
from services.gateway.markup.split import split_text

TEXT_LIMIT: Final = 4096
_MARKS: Final = {"bold": "*", "italic": "_", "strike": "~"}


def _span(span: md.Inline) -> str:
    if isinstance(span, md.Code):
        return f"`{span.text}`"
    if isinstance(span, md.Emphasis):
        mark = _MARKS[span.style]
        return f"{mark}{_spans(span.children)}{mark}"
    if isinstance(span, md.Link):
        label = _spans(span.children)
        return label if md.text_of(span.children) == span.url else f"{label} ({span.url})"
    if isinstance(span, md.Angle):
        return span.source[1:-1] if span.kind == "autolink" else span.source
    return span.text


def _spans(spans: tuple[md.Inline, ...]) -> str:
    return "".join(_span(s) for s in spans)


def _block(block: md.Block) -> str:
    if isinstance(block, md.CodeBlock):
        return f"```\n{block.body}\n```" if block.body.strip() else ""
    if isinstance(block, md.Quote):
        return "\n".join(f"> {text}" for line in block.lines if (text := _block(line)).strip())
    if isinstance(block, md.Heading):
        return f"*{_spans(block.spans)}*"
    if isinstance(block, md.Item):
        return f"{block.indent}- {_spans(block.spans)}"
    return _spans(block.spans)


def to_whatsapp(markdown: str) -> str:
    """Agent Markdown in WhatsApp markup; runs of blank lines collapse to one."""
    return md.collapse_blank([_block(b) for b in md.parse(markdown)])


def split_whatsapp(text: str, limit: int = TEXT_LIMIT) -> list[str]:
    """WhatsApp markup in parts of at most `limit` characters (see services/gateway/markup/split.py):
    code blocks and marker pairs cut by a break are closed and reopened."""
    return split_text(marks.atoms(text, len), limit, len)
