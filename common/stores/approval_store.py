"""Approvals (a person's yes or no to one tool call) and standing grants ("always allow this")."""

from __future__ import annotations

from typing import NamedTuple

import apsw

CREATE = (
    "INSERT INTO approvals (id, session_id, turn_id, agent, tool, arguments, reason, created_at, expires_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
GET = (
    "SELECT id, session_id, turn_id, agent, tool, arguments, reason, state, created_at, expires_at,"
    " decided_at, decided_by FROM approvals WHERE id = ?"
)
DECIDE = (
    "UPDATE approvals SET state = ?, decided_at = ?, decided_by = ? WHERE id = ? AND state = 'pending'"
)
DUE = "SELECT id FROM approvals WHERE state = 'pending' AND expires_at <= ? ORDER BY expires_at LIMIT ?"
PENDING = (
    "SELECT id, session_id, turn_id, agent, tool, arguments, reason, state, created_at, expires_at,"
    " decided_at, decided_by FROM approvals WHERE state = 'pending' ORDER BY created_at"
)
FOR_TURN = (
    "SELECT id, session_id, turn_id, agent, tool, arguments, reason, state, created_at, expires_at,"
    " decided_at, decided_by FROM approvals WHERE turn_id = ? ORDER BY created_at DESC LIMIT 1"
)
GRANT = "INSERT OR IGNORE INTO grants (agent, tool, pattern, created_at, created_by) VALUES (?, ?, ?, ?, ?)"
GRANTS = "SELECT pattern FROM grants WHERE agent = ? AND tool = ? ORDER BY id"


class Approval(NamedTuple):
    id: str
    session_id: int | None
    turn_id: int | None
    agent: str
    tool: str
    arguments: str
    reason: str
    state: str
    created_at: float
    expires_at: float
    decided_at: float | None
    decided_by: str


def create(conn: apsw.Connection, approval_id: str, session_id: int, turn_id: int, agent: str, tool: str,
           arguments: str, reason: str, now: float, ttl_s: float) -> None:
    conn.execute(CREATE, (approval_id, session_id, turn_id, agent, tool, arguments, reason, now, now + ttl_s))


def get(conn: apsw.Connection, approval_id: str) -> Approval | None:
    row = conn.execute(GET, (approval_id,)).fetchone()
    return None if row is None else Approval(*row)


def for_turn(conn: apsw.Connection, turn_id: int) -> Approval | None:
    """The latest approval asked for during this turn."""
    row = conn.execute(FOR_TURN, (turn_id,)).fetchone()
    return None if row is None else Approval(*row)


def decide(conn: apsw.Connection, approval_id: str, state: str, decided_by: str, now: float) -> bool:
    """approved | denied | expired; False when it was no longer pending."""
    conn.execute(DECIDE, (state, now, decided_by, approval_id))
    return conn.changes() > 0


def due(conn: apsw.Connection, now: float, limit: int = 100) -> list[str]:
    return [row[0] for row in conn.execute(DUE, (now, limit))]


def pending(conn: apsw.Connection) -> list[Approval]:
    return [Approval(*row) for row in conn.execute(PENDING)]


def grant(conn: apsw.Connection, agent: str, tool: str, pattern: str, created_by: str, now: float) -> None:
    conn.execute(GRANT, (agent, tool, pattern, now, created_by))


def grants(conn: apsw.Connection, agent: str, tool: str) -> list[str]:
    return [row[0] for row in conn.execute(GRANTS, (agent, tool))]
