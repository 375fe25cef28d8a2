"""Sessions (conversations) and the sender -> session map."""

from __future__ import annotations

from typing import NamedTuple

import apsw

MAPPED = "SELECT session_id FROM session_map WHERE agent = ? AND instance = ? AND chat = ?"
CREATE = (
    "INSERT INTO sessions (agent, instance, chat, created_at, last_active_at) VALUES (?, ?, ?, ?, ?)"
)
MAP = "INSERT OR REPLACE INTO session_map (agent, instance, chat, session_id) VALUES (?, ?, ?, ?)"
TOUCH = "UPDATE sessions SET last_active_at = ? WHERE id = ?"
GET = (
    "SELECT id, agent, instance, chat, title, summary, state, created_at, last_active_at, closed_at"
    " FROM sessions WHERE id = ?"
)
CLOSE = "UPDATE sessions SET state = 'closed', closed_at = ?, close_reason = ? WHERE id = ? AND state = 'open'"
UNMAP = "DELETE FROM session_map WHERE session_id = ?"
SET_SUMMARY = "UPDATE sessions SET summary = ?, summary_upto = ? WHERE id = ?"
SUMMARY = "SELECT summary, summary_upto FROM sessions WHERE id = ?"
LIST_RECENT = (
    "SELECT id, agent, instance, chat, title, summary, state, created_at, last_active_at, closed_at"
    " FROM sessions ORDER BY last_active_at DESC, id DESC LIMIT ?"
)
COUNT = "SELECT count(*) FROM sessions"


class Session(NamedTuple):
    id: int
    agent: str
    instance: str
    chat: str
    title: str
    summary: str
    state: str
    created_at: float
    last_active_at: float
    closed_at: float | None


def open_session(conn: apsw.Connection, agent: str, instance: str, chat: str, now: float) -> int:
    """The open session of this agent, instance and chat; a new one when there is none."""
    row = conn.execute(MAPPED, (agent, instance, chat)).fetchone()
    if row is not None:
        conn.execute(TOUCH, (now, row[0]))
        return int(row[0])
    conn.execute(CREATE, (agent, instance, chat, now, now))
    session_id = conn.last_insert_rowid()
    conn.execute(MAP, (agent, instance, chat, session_id))
    return session_id


def mapped(conn: apsw.Connection, agent: str, instance: str, chat: str) -> int | None:
    """The open session a chat of an instance talks in, if it has one."""
    row = conn.execute(MAPPED, (agent, instance, chat)).fetchone()
    return None if row is None else int(row[0])


def close(conn: apsw.Connection, session_id: int, reason: str, now: float) -> bool:
    """End a conversation (/new, reset): the next message in its chat opens a fresh session."""
    conn.execute(CLOSE, (now, reason, session_id))
    changed = conn.changes() > 0
    conn.execute(UNMAP, (session_id,))
    return changed


def touch(conn: apsw.Connection, session_id: int, now: float) -> None:
    conn.execute(TOUCH, (now, session_id))


def touch_many(conn: apsw.Connection, rows: list[tuple[float, int]]) -> None:
    """Bulk (now, session_id) touches: the benchmark's baseline, as ``open_session`` does per message."""
    conn.executemany(TOUCH, rows)


def set_summary(conn: apsw.Connection, session_id: int, summary: str, upto_turn_id: int) -> bool:
    """Compaction: the turns up to ``upto_turn_id`` are now represented by ``summary``."""
    conn.execute(SET_SUMMARY, (summary, upto_turn_id, session_id))
    return conn.changes() > 0


def summary(conn: apsw.Connection, session_id: int) -> tuple[str, int]:
    """(summary, the last turn id it covers); ("", 0) when there is none."""
    row = conn.execute(SUMMARY, (session_id,)).fetchone()
    return ("", 0) if row is None else (row[0], int(row[1]))


def get(conn: apsw.Connection, session_id: int) -> Session | None:
    row = conn.execute(GET, (session_id,)).fetchone()
    return None if row is None else Session(*row)


def recent(conn: apsw.Connection, limit: int = 50) -> list[Session]:
    return [Session(*row) for row in conn.execute(LIST_RECENT, (limit,))]


def count(conn: apsw.Connection) -> int:
    return int(conn.execute(COUNT).fetchall()[0][0])


LIST_RECENT_WITH_TURNS = (
    "SELECT s.id, s.agent, s.instance, s.chat, s.title, s.summary, s.state, s.created_at, s.last_active_at,"
    " s.closed_at, (SELECT count(*) FROM turns t WHERE t.session_id = s.id)"
    " FROM sessions s ORDER BY s.last_active_at DESC, s.id DESC LIMIT ?"
)
TURN_COUNT = "SELECT count(*) FROM turns WHERE session_id = ?"


def recent_with_turns(conn: apsw.Connection, limit: int = 50) -> list[tuple[Session, int]]:
    """The most recently active sessions, each with its number of turns (`starling session list`)."""
    return [(Session(*row[:10]), int(row[10])) for row in conn.execute(LIST_RECENT_WITH_TURNS, (limit,))]


def turn_count(conn: apsw.Connection, session_id: int) -> int:
    return int(conn.execute(TURN_COUNT, (session_id,)).fetchall()[0][0])


LIST_RECENT_FOR_AGENT_WITH_TURNS = (
    "SELECT s.id, s.agent, s.instance, s.chat, s.title, s.summary, s.state, s.created_at, s.last_active_at,"
    " s.closed_at, (SELECT count(*) FROM turns t WHERE t.session_id = s.id)"
    " FROM sessions s WHERE s.agent = ? ORDER BY s.last_active_at DESC, s.id DESC LIMIT ?"
)


def recent_for_agent_with_turns(conn: apsw.Connection, agent: str, limit: int = 50) -> list[tuple[Session, int]]:
    """One agent's most recently active sessions, each with its number of turns (the MCP server's sessions_list)."""
    return [(Session(*row[:10]), int(row[10])) for row in conn.execute(LIST_RECENT_FOR_AGENT_WITH_TURNS, (agent, limit))]
