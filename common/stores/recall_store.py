"""Recall: the FTS5 index over turns (porter stemming, bm25 ranking), its backfill and rebuild."""

from __future__ import annotations

from typing import NamedTuple

import apsw

SEARCH = (
    "SELECT t.id, t.session_id, t.role, t.content, t.created_at, bm25(turns_fts) AS rank"
    " FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid"
    " WHERE turns_fts MATCH ? ORDER BY rank LIMIT ?"
)
SEARCH_AGENT = (
    "SELECT t.id, t.session_id, t.role, t.content, t.created_at, bm25(turns_fts) AS rank"
    " FROM turns_fts JOIN turns t ON t.id = turns_fts.rowid JOIN sessions s ON s.id = t.session_id"
    " WHERE turns_fts MATCH ? AND s.agent = ? ORDER BY rank LIMIT ?"
)
REBUILD = "INSERT INTO turns_fts (turns_fts) VALUES ('rebuild')"
CLEAR = "INSERT INTO turns_fts (turns_fts) VALUES ('delete-all')"
INDEXED = "SELECT count(*) FROM turns_fts_docsize"
TURNS = "SELECT count(*) FROM turns"


class Hit(NamedTuple):
    turn_id: int
    session_id: int
    role: str
    content: str
    created_at: float
    rank: float


def quote_query(text: str) -> str:
    """A person's words as an FTS5 query: each word a quoted term, all required (no syntax errors)."""
    words = [w for w in "".join(c if c.isalnum() else " " for c in text).split() if w]
    return " ".join('"' + w + '"' for w in words)


def search(conn: apsw.Connection, text: str, limit: int = 10, agent: str | None = None) -> list[Hit]:
    query = quote_query(text)
    if not query:
        return []
    if agent is None:
        rows = conn.execute(SEARCH, (query, limit))
    else:
        rows = conn.execute(SEARCH_AGENT, (query, agent, limit))
    return [Hit(*row) for row in rows]


def rebuild(conn: apsw.Connection) -> None:
    conn.execute(REBUILD)


def clear(conn: apsw.Connection) -> None:
    """Empty the index (the turns stay); the next open or `fts rebuild` fills it again."""
    conn.execute(CLEAR)


def needs_backfill(conn: apsw.Connection) -> bool:
    """True when the index holds fewer documents than there are turns (a table filled before it)."""
    return conn.execute(INDEXED).fetchall()[0][0] != conn.execute(TURNS).fetchall()[0][0]
