"""recall_search: full-text search over this agent's past conversations (the FTS5 index, bm25 order)."""

from __future__ import annotations

import re
import time
from typing import Any

from common.db import read_tx
from common.stores import recall_store
from services.runner.llm import ToolSpec
from services.runner.tools.base import Tool, ToolContext, ToolResult

DEFAULT_LIMIT = 8
MAX_LIMIT = 25
SNIPPET = 240


def snippet(content: str, query: str, width: int = SNIPPET) -> str:
    """About ``width`` characters of content around the first word of the query it contains."""
    flat = " ".join(content.split())
    if len(flat) <= width:
        return flat
    words = [w for w in re.split(r"\W+", query.casefold()) if w]
    lowered = flat.casefold()
    hits = [i for i in (lowered.find(w) for w in words) if i >= 0]
    at = min(hits) if hits else 0
    start = max(0, min(at - width // 3, len(flat) - width))
    text = flat[start : start + width]
    return ("…" if start > 0 else "") + text + ("…" if start + width < len(flat) else "")


async def recall_search(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    query = args["query"]
    limit = min(max(1, args.get("limit", DEFAULT_LIMIT)), MAX_LIMIT)
    with read_tx(ctx.reader()) as conn:
        hits = recall_store.search(conn, query, limit, agent=ctx.agent)
    if not hits:
        return ToolResult(f"nothing found in past conversations for {query!r}")
    lines = []
    for hit in hits:
        day = time.strftime("%Y-%m-%d %H:%M", time.gmtime(hit.created_at))
        lines.append(f"- session {hit.session_id}, turn {hit.turn_id}, {hit.role}, {day} UTC:"
                     f" {snippet(hit.content, query)}")
    return ToolResult("\n".join(lines))


TOOLS = [
    Tool(ToolSpec(
        "recall_search",
        "Search your past conversations (all your sessions) by words; best matches first, each with its"
        " session, turn, role, date and a snippet.",
        {"type": "object", "properties": {
            "query": {"type": "string", "description": "words to look for (all must occur)"},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                      "description": f"most results (default {DEFAULT_LIMIT})"},
        }, "required": ["query"], "additionalProperties": False}),
        "recall", recall_search),
]
