"""What the dashboard's pages read that no other store answers: today's figures, conversations by agent,
instance and chat, search hits with their highlights, a transcript in conversation order, the approvals
of a session and the decided ones, usage per day. Every query is bounded (a LIMIT or an indexed range)."""

from __future__ import annotations

from typing import NamedTuple

import apsw

from common.stores.approval_store import Approval
from common.stores.audit_store import ToolRun

USER_TURNS_SINCE = (
    "SELECT count(*), coalesce(sum(state = 'failed'), 0) FROM turns WHERE role = 'user' AND created_at >= ?"
)
USAGE_SINCE = (
    "SELECT count(*), coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0), coalesce(sum(cost_usd), 0)"
    " FROM usage WHERE created_at >= ?"
)
ERRORS_SINCE = "SELECT count(*) FROM daemon_log WHERE at >= ? AND level IN ('error', 'critical')"
PENDING_APPROVALS = "SELECT count(*) FROM approvals WHERE state = 'pending'"
PENDING_CODES = "SELECT count(*) FROM pairing_codes WHERE approved_at IS NULL AND expires_at > ?"

_SESSION = "s.id, s.agent, s.instance, s.chat, s.title, s.state, s.created_at, s.last_active_at"
SESSIONS = (
    "SELECT " + _SESSION + ", (SELECT count(*) FROM turns t WHERE t.session_id = s.id)"
    " FROM sessions s WHERE (? = '' OR s.agent = ?) AND (? = '' OR s.instance = ?) AND (? = '' OR s.chat = ?)"
    " ORDER BY s.last_active_at DESC, s.id DESC LIMIT ? OFFSET ?"
)
AGENTS = "SELECT DISTINCT agent FROM sessions ORDER BY agent"
INSTANCES = "SELECT DISTINCT instance FROM sessions ORDER BY instance"
SEARCH = (
    "SELECT t.id, t.session_id, t.role, snippet(turns_fts, 0, char(2), char(3), '…', 24), t.created_at,"
    " s.agent, s.instance, s.chat FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid"
    " JOIN sessions s ON s.id = t.session_id WHERE turns_fts MATCH ? AND (? = '' OR s.agent = ?)"
    " ORDER BY bm25(turns_fts) LIMIT ?"
)
SESSION = "SELECT " + _SESSION + ", 0 FROM sessions s WHERE s.id = ?"
TRANSCRIPT = (
    "SELECT id, parent_id, role, content, sender, sender_name, attachments, meta, state, error, created_at"
    " FROM turns WHERE session_id = ? ORDER BY coalesce(parent_id, id), id LIMIT ?"
)
TOOLS = (
    "SELECT id, turn_id, tool, arguments, outcome, result_path, error, duration_ms, created_at"
    " FROM tool_executions WHERE session_id = ? ORDER BY id LIMIT ?"
)
_APPROVAL = (
    "id, session_id, turn_id, agent, tool, arguments, reason, state, created_at, expires_at, decided_at, decided_by"
)
SESSION_APPROVALS = "SELECT " + _APPROVAL + " FROM approvals WHERE session_id = ? ORDER BY created_at LIMIT ?"
DECIDED_APPROVALS = (
    "SELECT " + _APPROVAL + " FROM approvals WHERE state != 'pending' ORDER BY coalesce(decided_at, created_at) DESC"
    " LIMIT ?"
)
USAGE_BY_DAY = (
    "SELECT date(created_at, 'unixepoch', 'localtime') AS day, agent, model, count(*), sum(input_tokens),"
    " sum(output_tokens), sum(cost_usd) FROM usage WHERE created_at >= ? GROUP BY day, agent, model ORDER BY day"
)


class Today(NamedTuple):
    turns: int
    failed_turns: int
    model_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    errors: int
    pending_approvals: int
    pending_codes: int


class SessionRow(NamedTuple):
    id: int
    agent: str
    instance: str
    chat: str
    title: str
    state: str
    created_at: float
    last_active_at: float
    turns: int


class Hit(NamedTuple):
    turn_id: int
    session_id: int
    role: str
    snippet: str  # the matched words between \x02 and \x03
    created_at: float
    agent: str
    instance: str
    chat: str


class Line(NamedTuple):
    id: int
    parent_id: int | None
    role: str
    content: str
    sender: str
    sender_name: str
    attachments: str
    meta: str
    state: str | None
    error: str
    created_at: float


class UsageDay(NamedTuple):
    day: str  # YYYY-MM-DD, local
    agent: str
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float


def today(conn: apsw.Connection, since: float, now: float) -> Today:
    turns, failed = conn.execute(USER_TURNS_SINCE, (since,)).fetchone()
    calls, tokens_in, tokens_out, cost = conn.execute(USAGE_SINCE, (since,)).fetchone()
    errors = conn.execute(ERRORS_SINCE, (since,)).fetchone()[0]
    approvals = conn.execute(PENDING_APPROVALS).fetchone()[0]
    codes = conn.execute(PENDING_CODES, (now,)).fetchone()[0]
    return Today(int(turns), int(failed), int(calls), int(tokens_in), int(tokens_out), float(cost), int(errors),
                 int(approvals), int(codes))


def sessions(conn: apsw.Connection, agent: str = "", instance: str = "", chat: str = "", limit: int = 50,
             offset: int = 0) -> list[SessionRow]:
    args = (agent, agent, instance, instance, chat, chat, limit, offset)
    return [SessionRow(*row) for row in conn.execute(SESSIONS, args)]


def agents(conn: apsw.Connection) -> list[str]:
    return [row[0] for row in conn.execute(AGENTS)]


def instances(conn: apsw.Connection) -> list[str]:
    return [row[0] for row in conn.execute(INSTANCES)]


def search(conn: apsw.Connection, fts_query: str, agent: str = "", limit: int = 50) -> list[Hit]:
    """Hits of an FTS5 query (recall_store.quote_query makes one of a person's words), best first."""
    if not fts_query:
        return []
    return [Hit(*row) for row in conn.execute(SEARCH, (fts_query, agent, agent, limit))]


def session(conn: apsw.Connection, session_id: int) -> SessionRow | None:
    row = conn.execute(SESSION, (session_id,)).fetchone()
    return None if row is None else SessionRow(*row)


def transcript(conn: apsw.Connection, session_id: int, limit: int = 500) -> list[Line]:
    return [Line(*row) for row in conn.execute(TRANSCRIPT, (session_id, limit))]


def tools(conn: apsw.Connection, session_id: int, limit: int = 500) -> list[ToolRun]:
    return [ToolRun(*row) for row in conn.execute(TOOLS, (session_id, limit))]


def session_approvals(conn: apsw.Connection, session_id: int, limit: int = 200) -> list[Approval]:
    return [Approval(*row) for row in conn.execute(SESSION_APPROVALS, (session_id, limit))]


def decided_approvals(conn: apsw.Connection, limit: int = 50) -> list[Approval]:
    return [Approval(*row) for row in conn.execute(DECIDED_APPROVALS, (limit,))]


def usage_by_day(conn: apsw.Connection, since: float) -> list[UsageDay]:
    return [UsageDay(*row) for row in conn.execute(USAGE_BY_DAY, (since,))]
