"""The audit trail of what agents did: tool executions, model usage and cost."""

from __future__ import annotations

from typing import NamedTuple

import apsw

TOOL = (
    "INSERT INTO tool_executions (session_id, turn_id, agent, tool, arguments, outcome, result_path, error,"
    " duration_ms, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
USAGE = (
    "INSERT INTO usage (session_id, turn_id, agent, provider, model, input_tokens, output_tokens, cost_usd,"
    " created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
TOOLS_FOR_SESSION = (
    "SELECT id, turn_id, tool, arguments, outcome, result_path, error, duration_ms, created_at"
    " FROM tool_executions WHERE session_id = ? ORDER BY id"
)
EVENT = "INSERT INTO audit (at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)"
EVENTS = "SELECT id, at, actor, action, target, detail FROM audit WHERE action = ? ORDER BY id"
USAGE_FOR_SESSION = (
    "SELECT coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0), coalesce(sum(cost_usd), 0)"
    " FROM usage WHERE session_id = ?"
)


class ToolRun(NamedTuple):
    id: int
    turn_id: int
    tool: str
    arguments: str
    outcome: str
    result_path: str
    error: str
    duration_ms: float
    created_at: float


def record_tool(conn: apsw.Connection, session_id: int, turn_id: int, agent: str, tool: str, arguments: str,
                outcome: str, result_path: str, error: str, duration_ms: float, now: float) -> int:
    conn.execute(TOOL, (session_id, turn_id, agent, tool, arguments, outcome, result_path, error, duration_ms, now))
    return conn.last_insert_rowid()


def record_usage(conn: apsw.Connection, session_id: int, turn_id: int, agent: str, provider: str, model: str,
                 input_tokens: int, output_tokens: int, cost_usd: float, now: float) -> int:
    conn.execute(USAGE, (session_id, turn_id, agent, provider, model, input_tokens, output_tokens, cost_usd, now))
    return conn.last_insert_rowid()


class Event(NamedTuple):
    id: int
    at: float
    actor: str
    action: str
    target: str
    detail: str  # JSON


def record_event(conn: apsw.Connection, at: float, actor: str, action: str, target: str, detail_json: str) -> int:
    """An audit row for something done to Starling itself (not by an agent's tool): a clock confirmed, a
    turn failed for crashing its runner."""
    conn.execute(EVENT, (at, actor, action, target, detail_json))
    return conn.last_insert_rowid()


def events(conn: apsw.Connection, action: str) -> list[Event]:
    return [Event(*row) for row in conn.execute(EVENTS, (action,))]


def tools_for_session(conn: apsw.Connection, session_id: int) -> list[ToolRun]:
    return [ToolRun(*row) for row in conn.execute(TOOLS_FOR_SESSION, (session_id,))]


def usage_for_session(conn: apsw.Connection, session_id: int) -> tuple[int, int, float]:
    """(input tokens, output tokens, cost in USD) of every model call in the session."""
    row = conn.execute(USAGE_FOR_SESSION, (session_id,)).fetchone()
    return int(row[0]), int(row[1]), float(row[2])


USAGE_TOTALS = (
    "SELECT agent, provider, model, count(*), coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),"
    " coalesce(sum(cost_usd), 0) FROM usage WHERE created_at >= ? AND (? = '' OR agent = ?)"
    " GROUP BY agent, provider, model ORDER BY agent, provider, model"
)


class UsageTotal(NamedTuple):
    agent: str
    provider: str
    model: str
    calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float


def usage_totals(conn: apsw.Connection, since: float, agent: str = "") -> list[UsageTotal]:
    """Model calls, tokens and cost since ``since``, per agent, provider and model ("" agent: every agent)."""
    return [UsageTotal(*row) for row in conn.execute(USAGE_TOTALS, (since, agent, agent))]
