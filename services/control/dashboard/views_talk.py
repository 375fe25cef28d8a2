"""Conversations: the list by agent, instance and chat, full-text search with highlighted hits (the recall
index), one transcript with its tool calls (name, arguments, result, approval), and its attachments."""

from __future__ import annotations

import json
import mimetypes
from pathlib import Path
from urllib.parse import quote

from aiohttp import web

from common.stores import dashboard_views_store as views
from common.stores.recall_store import quote_query
from services.control.dashboard.app import Dashboard

PAGE = 50
RESULT_PREVIEW = 4000  # characters of a stored tool result shown in the transcript


async def conversations(d: Dashboard, request: web.Request) -> web.StreamResponse:
    q = request.query
    agent, instance, chat = q.get("agent", "")[:64], q.get("instance", "")[:64], q.get("chat", "")[:200]
    text = q.get("q", "")[:500]
    try:
        page = max(0, int(q.get("page", "0")))
    except ValueError:
        page = 0
    with d.deps.read() as conn:
        hits = views.search(conn, quote_query(text), agent) if text.strip() else []
        rows = [] if text.strip() else views.sessions(conn, agent, instance, chat, PAGE + 1, page * PAGE)
        agents, instances = views.agents(conn), views.instances(conn)
    return d.render(request, "conversations.html", rows=rows[:PAGE], more=len(rows) > PAGE, page=page,
                    hits=hits, q=text, agent=agent, instance=instance, chat=chat, agents=agents,
                    instances=instances)


def _attachments(d: Dashboard, text: str) -> list[tuple[str, str]]:
    """(name, link) of each attachment of a turn; the link is "" for a file outside data/attachments/."""
    try:
        names = json.loads(text or "[]")
    except ValueError:
        return []
    root = d.deps.paths.attachments_dir
    out = []
    for name in names if isinstance(names, list) else []:
        path = Path(str(name))
        try:
            out.append((path.name, "/attachments/" + quote(str(path.relative_to(root)))))
        except ValueError:
            out.append((path.name, ""))
    return out


def _result(d: Dashboard, result_path: str) -> str:
    """A tool result kept in data/tool-output/, its start only; nothing outside that folder is read."""
    if not result_path:
        return ""
    root = d.deps.paths.tool_output_dir.resolve()
    path = Path(result_path)
    path = (path if path.is_absolute() else root / path).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        return ""
    with open(path, "rb") as f:
        return f.read(RESULT_PREVIEW).decode("utf-8", "replace")


async def transcript(d: Dashboard, request: web.Request) -> web.StreamResponse:
    try:
        session_id = int(request.match_info["id"])
    except ValueError:
        raise web.HTTPNotFound() from None
    with d.deps.read() as conn:
        session = views.session(conn, session_id)
        if session is None:
            return d.plain(request, 404, f"session {session_id} does not exist (see Conversations)")
        lines = views.transcript(conn, session_id)
        tools = views.tools(conn, session_id)
        approvals = views.session_approvals(conn, session_id)
    by_turn: dict[int, list] = {}
    for tool in tools:
        by_turn.setdefault(tool.turn_id, []).append(
            {"row": tool, "result": _result(d, tool.result_path)})
    asked: dict[int, list] = {}
    for a in approvals:
        asked.setdefault(a.turn_id or 0, []).append(a)
    entries = [{"line": line, "attachments": _attachments(d, line.attachments),
                "tools": by_turn.get(line.id, []) if line.role == "user" else [],
                "approvals": asked.get(line.id, []) if line.role == "user" else []} for line in lines]
    return d.render(request, "transcript.html", conv=session, entries=entries)


async def attachment(d: Dashboard, request: web.Request) -> web.StreamResponse:
    """A file under data/attachments/, served as a download (never rendered as this site's page)."""
    root = d.deps.paths.attachments_dir.resolve()
    path = (root / request.match_info["path"]).resolve()
    if not path.is_relative_to(root) or not path.is_file():
        raise web.HTTPNotFound()
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    inline = kind.startswith("image/") and kind != "image/svg+xml"
    return web.FileResponse(path, headers={
        "Content-Type": kind, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store",
        "Content-Disposition": ("inline" if inline else "attachment") + f'; filename="{path.name}"',
        "Content-Security-Policy": "default-src 'none'; sandbox"})


ROUTES = [
    ("GET", "/conversations", conversations, "view"),
    ("GET", "/conversations/{id}", transcript, "view"),
    ("GET", "/attachments/{path:.+}", attachment, "view"),
]
