"""The sweeper's SQL: retention deletes in bounded chunks, conversations to reset, session-memory captures.

Deletes run in the writer (services/writer/retention_ops.py), one chunk of at most ``limit`` rows per
statement, so a caller can stop between chunks when its time is up. Reads run in the sweeper.
"""

from __future__ import annotations

import json
from typing import NamedTuple

import apsw

# A conversation with a turn pending, running or parked on an approval is still in use: never reset,
# deleted or captured. (Two probes so that each uses its partial index: turns_work, turns_waiting.)
_IN_USE = (
    "EXISTS (SELECT 1 FROM turns t WHERE t.state IN ('pending', 'claimed') AND t.session_id = s.id)"
    " OR EXISTS (SELECT 1 FROM turns w WHERE w.state = 'waiting' AND w.session_id = s.id)"
)

# ---------------------------------------------------------------- retention (writer side)

SESSIONS_PAST = (
    "SELECT s.id FROM sessions s WHERE s.last_active_at < ? AND NOT (" + _IN_USE + ")"
    " ORDER BY s.last_active_at LIMIT ?"
)
STILL_PAST = "SELECT 1 FROM sessions s WHERE s.id = ? AND s.last_active_at < ? AND NOT (" + _IN_USE + ")"
# in conversation order, the order of the session's one index (turns_conversation)
TURN_CHUNK = (
    "SELECT id, attachments FROM turns WHERE session_id = ? ORDER BY coalesce(parent_id, id), id LIMIT ?"
)
DELETE_TURNS = "DELETE FROM turns WHERE id IN (SELECT value FROM json_each(?))"
DELETE_SESSION_OUTBOX = (
    "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE session_id = ? AND state IN ('sent', 'failed')"
    " LIMIT ?)"
)
DELETE_SESSION_TOOLS = (
    "DELETE FROM tool_executions WHERE id IN (SELECT id FROM tool_executions WHERE session_id = ? LIMIT ?)"
)
DELETE_SESSION_APPROVALS = "DELETE FROM approvals WHERE id IN (SELECT id FROM approvals WHERE session_id = ? LIMIT ?)"
DELETE_SESSION = "DELETE FROM sessions WHERE id = ?"  # session_map follows (ON DELETE CASCADE)
DELETE_OLD_OUTBOX = (
    "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox WHERE state IN ('sent', 'failed') AND created_at < ?"
    " ORDER BY created_at LIMIT ?)"
)
DELETE_OLD_INBOUND_KEYS = (
    "DELETE FROM inbound_keys WHERE key IN (SELECT key FROM inbound_keys WHERE created_at < ?"
    " ORDER BY created_at LIMIT ?)"
)
DELETE_OLD_CRON_RUNS = (  # finished runs only, and never a job's latest (the scheduler counts from it)
    "DELETE FROM cron_runs WHERE id IN (SELECT r.id FROM cron_runs r WHERE r.scheduled_for < ?"
    " AND r.state != 'fired'"
    " AND r.scheduled_for < (SELECT max(x.scheduled_for) FROM cron_runs x WHERE x.job_id = r.job_id)"
    " ORDER BY r.scheduled_for LIMIT ?)"
)
DELETE_OLD_AUDIT = "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE at < ? ORDER BY at LIMIT ?)"
DELETE_OLD_TOOLS = (
    "DELETE FROM tool_executions WHERE id IN (SELECT id FROM tool_executions WHERE created_at < ?"
    " ORDER BY created_at LIMIT ?)"
)
JOBS_PAST = (
    "SELECT id, log_path FROM jobs WHERE state IN ('done', 'failed', 'killed') AND ended_at < ?"
    " ORDER BY ended_at LIMIT ?"
)
DELETE_JOB = "DELETE FROM jobs WHERE id = ? AND state != 'running'"


def sessions_past(conn: apsw.Connection, before: float, limit: int) -> list[int]:
    """Conversations last active before ``before`` and not in use, oldest first."""
    return [int(row[0]) for row in conn.execute(SESSIONS_PAST, (before, limit))]


def still_past(conn: apsw.Connection, session_id: int, before: float) -> bool:
    return conn.execute(STILL_PAST, (session_id, before)).fetchone() is not None


def delete_turn_chunk(conn: apsw.Connection, session_id: int, limit: int) -> tuple[int, list[str]]:
    """Delete a session's first ``limit`` turns in conversation order: (how many, their attachments as
    stored JSON lists)."""
    rows = conn.execute(TURN_CHUNK, (session_id, limit)).fetchall()
    if not rows:
        return 0, []
    conn.execute(DELETE_TURNS, (json.dumps([row[0] for row in rows]),))
    return conn.changes(), [row[1] for row in rows if row[1] and row[1] != "[]"]


def delete_session_outbox(conn: apsw.Connection, session_id: int, limit: int) -> int:
    """A session's delivered and failed messages (undelivered ones stay, their session set to NULL)."""
    conn.execute(DELETE_SESSION_OUTBOX, (session_id, limit))
    return conn.changes()


def delete_session_tools(conn: apsw.Connection, session_id: int, limit: int) -> int:
    conn.execute(DELETE_SESSION_TOOLS, (session_id, limit))
    return conn.changes()


def delete_session_approvals(conn: apsw.Connection, session_id: int, limit: int) -> int:
    conn.execute(DELETE_SESSION_APPROVALS, (session_id, limit))
    return conn.changes()


def delete_session(conn: apsw.Connection, session_id: int) -> int:
    conn.execute(DELETE_SESSION, (session_id,))
    return conn.changes()


def delete_old_outbox(conn: apsw.Connection, before: float, limit: int) -> int:
    conn.execute(DELETE_OLD_OUTBOX, (before, limit))
    return conn.changes()


def delete_old_inbound_keys(conn: apsw.Connection, before: float, limit: int) -> int:
    conn.execute(DELETE_OLD_INBOUND_KEYS, (before, limit))
    return conn.changes()


def delete_old_audit(conn: apsw.Connection, before: float, limit: int) -> int:
    conn.execute(DELETE_OLD_AUDIT, (before, limit))
    return conn.changes()


def delete_old_cron_runs(conn: apsw.Connection, before: float, limit: int) -> int:
    conn.execute(DELETE_OLD_CRON_RUNS, (before, limit))
    return conn.changes()


def delete_old_tools(conn: apsw.Connection, before: float, limit: int) -> int:
    conn.execute(DELETE_OLD_TOOLS, (before, limit))
    return conn.changes()


def jobs_past(conn: apsw.Connection, before: float, limit: int) -> list[tuple[int, str]]:
    """(id, log path) of jobs that ended before ``before``; a running job is never among them."""
    return [(int(row[0]), row[1]) for row in conn.execute(JOBS_PAST, (before, limit))]


def delete_job(conn: apsw.Connection, job_id: int) -> int:
    conn.execute(DELETE_JOB, (job_id,))
    return conn.changes()


# ---------------------------------------------------------------- resets (both sides)

OPEN_QUIET = (
    "SELECT s.id, s.last_active_at FROM sessions s WHERE s.state = 'open' AND s.last_active_at < ?"
    " AND NOT (" + _IN_USE + ") ORDER BY s.last_active_at LIMIT ?"
)
RESETTABLE = (
    "SELECT 1 FROM sessions s WHERE s.id = ? AND s.state = 'open' AND s.last_active_at <= ?"
    " AND NOT (" + _IN_USE + ")"
)


def open_quiet(conn: apsw.Connection, since: float, limit: int) -> list[tuple[int, float]]:
    """(id, last_active_at) of open conversations not in use and quiet since before ``since``."""
    return [(int(row[0]), float(row[1])) for row in conn.execute(OPEN_QUIET, (since, limit))]


def resettable(conn: apsw.Connection, session_id: int, last_active_at: float) -> bool:
    """Open, not in use, and not active after ``last_active_at``."""
    return conn.execute(RESETTABLE, (session_id, last_active_at)).fetchone() is not None


# ---------------------------------------------------------------- session memory

TO_CAPTURE = (
    "SELECT s.id, s.agent, s.instance, s.chat, s.created_at, s.last_active_at, s.closed_at, s.close_reason"
    " FROM sessions s WHERE s.state = 'closed' AND s.captured_at IS NULL AND NOT (" + _IN_USE + ")"
    " ORDER BY s.closed_at LIMIT ?"
)
TRANSCRIPT = (
    "SELECT id, coalesce(parent_id, id), role, content, sender, sender_name, created_at FROM turns"
    " WHERE session_id = ? AND (coalesce(parent_id, id), id) > (?, ?)"
    " ORDER BY coalesce(parent_id, id), id LIMIT ?"
)
MARK_CAPTURED = "UPDATE sessions SET captured_at = ? WHERE id = ? AND captured_at IS NULL"
CAPTURED_AT = "SELECT captured_at FROM sessions WHERE id = ?"


class Closed(NamedTuple):
    id: int
    agent: str
    instance: str
    chat: str
    created_at: float
    last_active_at: float
    closed_at: float | None
    close_reason: str


class Line(NamedTuple):
    id: int
    thread: int  # the user turn this answers (its own id for a user turn)
    role: str
    content: str
    sender: str
    sender_name: str
    created_at: float


def to_capture(conn: apsw.Connection, limit: int) -> list[Closed]:
    """Closed conversations not yet captured and no longer in use, in the order they closed."""
    return [Closed(*row) for row in conn.execute(TO_CAPTURE, (limit,))]


def transcript(conn: apsw.Connection, session_id: int, after: tuple[int, int], limit: int) -> list[Line]:
    """A page of a conversation in conversation order (each user turn, then what answered it), after
    the (thread, id) position ``after``; (0, 0) starts at the beginning."""
    return [Line(*row) for row in conn.execute(TRANSCRIPT, (session_id, after[0], after[1], limit))]


def mark_captured(conn: apsw.Connection, session_id: int, now: float) -> bool:
    conn.execute(MARK_CAPTURED, (now, session_id))
    return conn.changes() > 0


def captured_at(conn: apsw.Connection, session_id: int) -> float | None:
    row = conn.execute(CAPTURED_AT, (session_id,)).fetchone()
    return None if row is None else row[0]


# ---------------------------------------------------------------- files (sweeper side)

OLDEST_SESSION_BY_AGENT = "SELECT agent, min(created_at) FROM sessions GROUP BY agent"
JOB_LOG_PATHS = "SELECT log_path FROM jobs"


def oldest_session_by_agent(conn: apsw.Connection) -> dict[str, float]:
    """When each agent's oldest remaining conversation began: no older turn (or attachment) of it is left."""
    return {row[0]: float(row[1]) for row in conn.execute(OLDEST_SESSION_BY_AGENT)}


def job_log_paths(conn: apsw.Connection) -> set[str]:
    """The log file of every job still recorded."""
    return {row[0] for row in conn.execute(JOB_LOG_PATHS)}


# ---------------------------------------------------------------- seeding (tests and benchmarks only)

SEED_SESSION = (
    "INSERT INTO sessions (agent, instance, chat, state, created_at, last_active_at, closed_at, close_reason)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
SEED_MAP = "INSERT OR REPLACE INTO session_map (agent, instance, chat, session_id) VALUES (?, ?, ?, ?)"
SEED_TURN = (
    "INSERT INTO turns (session_id, parent_id, role, content, sender, attachments, state, created_at, done_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SEED_OUTBOX = (
    "INSERT INTO outbox (session_id, turn_id, instance, chat, body, state, created_at, sent_at)"
    " VALUES (?, ?, ?, ?, ?, 'sent', ?, ?)"
)
SEED_OUTBOX_ROW = (
    "INSERT INTO outbox (session_id, turn_id, instance, chat, body, state, created_at, sent_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
SEED_AUDIT = "INSERT INTO audit (at, actor, action, target) VALUES (?, ?, ?, ?)"
# what is left, per table the sweeper deletes from
COUNTS = {
    "sessions": "SELECT count(*) FROM sessions",
    "turns": "SELECT count(*) FROM turns",
    "outbox": "SELECT count(*) FROM outbox",
    "tool_executions": "SELECT count(*) FROM tool_executions",
    "approvals": "SELECT count(*) FROM approvals",
    "audit": "SELECT count(*) FROM audit",
    "jobs": "SELECT count(*) FROM jobs",
    "inbound_keys": "SELECT count(*) FROM inbound_keys",
}


def seed_session(conn: apsw.Connection, agent: str, instance: str, chat: str, created_at: float,
                 last_active_at: float, closed_at: float | None = None, close_reason: str = "") -> int:
    """A conversation as history left it: open (and mapped to its chat) unless ``closed_at`` is given."""
    state = "open" if closed_at is None else "closed"
    conn.execute(SEED_SESSION, (agent, instance, chat, state, created_at, last_active_at, closed_at, close_reason))
    session_id = conn.last_insert_rowid()
    if closed_at is None:
        conn.execute(SEED_MAP, (agent, instance, chat, session_id))
    return session_id


def seed_turn(conn: apsw.Connection, session_id: int, role: str, content: str, created_at: float,
              sender: str = "", parent_id: int | None = None, attachments_json: str = "[]",
              state: str | None = None) -> int:
    """One turn with a chosen time; a user turn is 'done' unless ``state`` says otherwise."""
    if state is None and role == "user":
        state = "done"
    conn.execute(SEED_TURN, (session_id, parent_id, role, content, sender, attachments_json, state, created_at,
                             created_at if state == "done" else None))
    return conn.last_insert_rowid()


def seed_exchanges(conn: apsw.Connection, session_id: int, instance: str, chat: str,
                   exchanges: list[tuple[str, str, float]]) -> int:
    """Bulk history for the sweep benchmark: each (user text, answer, time) becomes a done user turn, its
    answer, and the delivered outbox row of that answer. Returns the number of turns."""
    for text, answer, at in exchanges:
        conn.execute(SEED_TURN, (session_id, None, "user", text, "u", "[]", "done", at, at))
        user_id = conn.last_insert_rowid()
        conn.execute(SEED_TURN, (session_id, user_id, "assistant", answer, "", "[]", None, at, None))
        conn.execute(SEED_OUTBOX, (session_id, user_id, instance, chat, answer, at, at))
    return 2 * len(exchanges)


def seed_audit(conn: apsw.Connection, at: float, actor: str, action: str, target: str = "") -> int:
    conn.execute(SEED_AUDIT, (at, actor, action, target))
    return conn.last_insert_rowid()


def seed_outbox(conn: apsw.Connection, session_id: int | None, turn_id: int | None, instance: str, chat: str,
                body: str, state: str, at: float) -> int:
    """One outbox row in ``state`` (sent rows were sent at ``at``)."""
    conn.execute(SEED_OUTBOX_ROW, (session_id, turn_id, instance, chat, body, state, at,
                                   at if state == "sent" else None))
    return conn.last_insert_rowid()


def remaining(conn: apsw.Connection) -> dict[str, int]:
    """Rows left in each table retention deletes from (tests and the benchmark)."""
    return {table: int(conn.execute(query).fetchall()[0][0]) for table, query in COUNTS.items()}
