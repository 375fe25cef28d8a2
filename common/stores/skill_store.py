"""Skills the agents write: drafts waiting for the operator, and which skills turns loaded (the audit)."""

from __future__ import annotations

from typing import NamedTuple

import apsw

UNDECIDED = (
    "SELECT id FROM skill_drafts WHERE agent = ? AND name = ? AND state = 'draft' ORDER BY id DESC LIMIT 1"
)
INSERT = (
    "INSERT INTO skill_drafts (agent, name, description, body, state, session_id, created_at)"
    " VALUES (?, ?, ?, ?, 'draft', ?, ?)"
)
REPLACE = "UPDATE skill_drafts SET description = ?, body = ?, session_id = ?, created_at = ? WHERE id = ?"
DECIDE = "UPDATE skill_drafts SET state = ?, decided_at = ? WHERE id = ? AND state = 'draft'"
COLUMNS = "id, agent, name, description, body, state, session_id, created_at, decided_at"
DRAFTS = f"SELECT {COLUMNS} FROM skill_drafts WHERE state = 'draft' ORDER BY agent, name, id"
BY_NAME = f"SELECT {COLUMNS} FROM skill_drafts WHERE name = ? AND state = 'draft' ORDER BY agent, id"
SESSION_EXISTS = "SELECT 1 FROM sessions WHERE id = ?"
# skill_load calls that found their skill, from the tool audit (kept retention.audit_days)
LOADED_SINCE = (
    "SELECT agent, json_extract(arguments, '$.name'), count(*), max(created_at) FROM tool_executions"
    " WHERE tool = 'skill_load' AND outcome = 'ok' AND created_at >= ? AND json_valid(arguments)"
    " GROUP BY agent, json_extract(arguments, '$.name')"
)
OLDEST_AUDIT = "SELECT min(created_at) FROM tool_executions"


class Draft(NamedTuple):
    id: int
    agent: str
    name: str
    description: str
    body: str
    state: str
    session_id: int | None
    created_at: float
    decided_at: float | None


def save_draft(conn: apsw.Connection, agent: str, name: str, description: str, body: str, session_id: int | None,
               now: float) -> int:
    """Store a draft, replacing the same agent's undecided draft of that name; its id."""
    if session_id is not None and conn.execute(SESSION_EXISTS, (session_id,)).fetchone() is None:
        session_id = None
    row = conn.execute(UNDECIDED, (agent, name)).fetchone()
    if row is not None:
        conn.execute(REPLACE, (description, body, session_id, now, row[0]))
        return int(row[0])
    conn.execute(INSERT, (agent, name, description, body, session_id, now))
    return conn.last_insert_rowid()


def decide(conn: apsw.Connection, draft_id: int, state: str, now: float) -> bool:
    conn.execute(DECIDE, (state, now, draft_id))
    return conn.changes() > 0


def drafts(conn: apsw.Connection) -> list[Draft]:
    return [Draft(*row) for row in conn.execute(DRAFTS)]


def drafts_named(conn: apsw.Connection, name: str) -> list[Draft]:
    return [Draft(*row) for row in conn.execute(BY_NAME, (name,))]


def loaded_since(conn: apsw.Connection, since: float) -> dict[tuple[str, str], tuple[int, float]]:
    """(agent, skill) -> (loads, the last load's time) of every skill a turn loaded since ``since``."""
    return {(agent, name): (int(n), float(last)) for agent, name, n, last in conn.execute(LOADED_SINCE, (since,))
            if isinstance(name, str)}


def oldest_audit(conn: apsw.Connection) -> float | None:
    row = conn.execute(OLDEST_AUDIT).fetchone()
    return None if row is None or row[0] is None else float(row[0])
