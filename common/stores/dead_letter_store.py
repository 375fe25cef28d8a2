"""Dead letters: platform events passed over because they were refused for themselves, kept whole."""

from __future__ import annotations

from typing import NamedTuple

import apsw

INSERT = (
    "INSERT INTO dead_letters (platform, instance, event_key, reason, payload, received_at, created_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
FIND = "SELECT id FROM dead_letters WHERE instance = ? AND event_key = ? AND event_key != ''"
COUNT_BY_INSTANCE = "SELECT platform, instance, COUNT(*), MAX(created_at) FROM dead_letters GROUP BY platform, instance"
LATEST = ("SELECT id, platform, instance, event_key, reason, payload, received_at, created_at FROM dead_letters"
          " ORDER BY id DESC LIMIT ?")


class DeadLetter(NamedTuple):
    id: int
    platform: str
    instance: str
    event_key: str
    reason: str
    payload: str
    received_at: float
    created_at: float


class Count(NamedTuple):
    platform: str
    instance: str
    count: int
    latest_at: float


def add(conn: apsw.Connection, platform: str, instance: str, event_key: str, reason: str, payload: str,
        received_at: float, now: float) -> int:
    """The row's id; an event already kept (same instance and key) is not kept twice."""
    if event_key:
        found = conn.execute(FIND, (instance, event_key)).fetchall()
        if found:
            return int(found[0][0])
    conn.execute(INSERT, (platform, instance, event_key, reason, payload, received_at or now, now))
    return conn.last_insert_rowid()


def counts(conn: apsw.Connection) -> list[Count]:
    return [Count(*row) for row in conn.execute(COUNT_BY_INSTANCE)]


def latest(conn: apsw.Connection, limit: int = 20) -> list[DeadLetter]:
    return [DeadLetter(*row) for row in conn.execute(LATEST, (limit,))]
