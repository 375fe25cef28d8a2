"""The plain-text renderer: the agent's Markdown as a reader sees it, without markup, and plain text cut to a limit."""

from __future__ import annotations

from services.gateway.markup import model as md
from services.gateway.markup.split import Atom, split_text, text_atoms, utf16_len


def _span(span: md.Inline) -> str:
    if isinstance(span, md.Link):
        label = _spans(span.children)
        return label if label.strip() in ("", span.url) else f"{label} ({span.url})"
    if isinstance(span, md.Emphasis):
        return _spans(span.children)
    if isinstance(span, md.Angle):
        return span.source[1:-1] if span.kind == "autolink" else span.source
    return span.text


def _spans(spans: tuple[md.Inline, ...]) -> str:
    return "".join(_span(s) for s in spans)


def _block(block: md.Block) -> str:
    if isinstance(block, md.CodeBlock):
        return block.body if block.body.strip() else ""
    if isinstance(block, md.Quote):
        return "\n".join(f"> {text}" for line in block.lines if (text := _block(line)).strip())
    if isinstance(block, md.Item):
        return f"{block.indent}• {_spans(block.spans)}"
    return _spans(block.spans)


def to_plain(markdown: str) -> str:
    """Agent Markdown as plain text: markers gone, links "label (url)", bullets "• ", quotes "> "."""
    return md.collapse_blank([_block(b) for b in md.parse(markdown)])


def atoms(text: str) -> list[Atom]:
    return text_atoms(text, utf16_len)


def split_plain(text: str, limit: int = 4096) -> list[str]:
    """Plain text in parts of at most `limit` UTF-16 units (4,096: Telegram's and WhatsApp's limit)."""
    return split_text(atoms(text), limit)
