"""Idempotency: answers of applied write requests, and platform event ids already stored."""

from __future__ import annotations

import apsw

GET_ANSWER = "SELECT result FROM write_keys WHERE key = ?"
PUT_ANSWER = "INSERT INTO write_keys (key, result, created_at) VALUES (?, ?, ?)"
PRUNE_ANSWERS = (
    "DELETE FROM write_keys WHERE key IN "
    "(SELECT key FROM write_keys WHERE created_at < ? ORDER BY created_at LIMIT ?)"
)
ANSWERS_BETWEEN = "SELECT key, result FROM write_keys WHERE created_at >= ? AND created_at < ?"
FIND_INBOUND = "SELECT turn_id FROM inbound_keys WHERE key = ?"
FIND_INBOUND_MANY = "SELECT key, turn_id FROM inbound_keys WHERE key IN (SELECT value FROM json_each(?))"
PUT_INBOUND = "INSERT OR IGNORE INTO inbound_keys (key, turn_id, created_at) VALUES (?, ?, ?)"
PRUNE_INBOUND = (
    "DELETE FROM inbound_keys WHERE key IN "
    "(SELECT key FROM inbound_keys WHERE created_at < ? ORDER BY created_at LIMIT ?)"
)


def answer(conn: apsw.Connection, key: str) -> bytes | None:
    row = conn.execute(GET_ANSWER, (key,)).fetchone()
    return None if row is None else bytes(row[0])


def remember_answer(conn: apsw.Connection, key: str, result: bytes, now: float) -> None:
    conn.execute(PUT_ANSWER, (key, result, now))


def prune_answers(conn: apsw.Connection, older_than: float, limit: int) -> int:
    conn.execute(PRUNE_ANSWERS, (older_than, limit))
    return conn.changes()


def inbound_turn(conn: apsw.Connection, keys: list[str]) -> int | None:
    """The turn stored for any of these platform event ids, or None when all are new."""
    for key in keys:
        row = conn.execute(FIND_INBOUND, (key,)).fetchone()
        if row is not None:
            return int(row[0])
    return None


def inbound_turns(conn: apsw.Connection, keys_json: str) -> dict[str, int]:
    """Of the platform event ids in ``keys_json`` (a JSON list), those already stored: key -> turn id."""
    return {key: int(turn_id) for key, turn_id in conn.execute(FIND_INBOUND_MANY, (keys_json,))}


def remember_inbound(conn: apsw.Connection, keys: list[str], turn_id: int, now: float) -> None:
    for key in keys:
        conn.execute(PUT_INBOUND, (key, turn_id, now))


def remember_inbound_many(conn: apsw.Connection, rows: list[tuple[str, int, float]]) -> None:
    """Bulk (key, turn_id, created_at), the rows ``remember_inbound`` stores: a run of inbound messages
    in one group commit, and the writer benchmark's baseline."""
    conn.executemany(PUT_INBOUND, rows)


def prune_inbound(conn: apsw.Connection, older_than: float, limit: int) -> int:
    conn.execute(PRUNE_INBOUND, (older_than, limit))
    return conn.changes()


def answers_between(conn: apsw.Connection, since: float, until: float) -> list[tuple[str, bytes]]:
    """(key, encoded result) of the write requests applied in [since, until): which clients wrote what
    (a key starts with the client's name), for benchmarks."""
    return [(key, bytes(result)) for key, result in conn.execute(ANSWERS_BETWEEN, (since, until))]
