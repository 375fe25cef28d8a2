"""The outbox: messages waiting for a gateway, claimed per instance with leases, in order per chat."""

from __future__ import annotations

from typing import NamedTuple

import apsw

ENQUEUE = (
    "INSERT INTO outbox (session_id, turn_id, instance, chat, kind, body, file_path, reply_to, created_at,"
    " approval_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The head of each chat's queue can be taken when it is due, or when its holder's lease ran out.
CLAIMABLE = (
    "SELECT o.id FROM outbox o"
    " WHERE o.instance = ? AND o.state IN ('pending', 'claimed')"
    " AND ((o.state = 'pending' AND o.not_before <= ?) OR (o.state = 'claimed' AND o.lease_until <= ?))"
    " AND o.id = (SELECT min(h.id) FROM outbox h WHERE h.instance = o.instance AND h.chat = o.chat"
    "             AND h.state IN ('pending', 'claimed'))"
    " ORDER BY o.id LIMIT ?"
)
CLAIMABLE_CHAT = (  # the head of one chat's queue, if it can be taken
    "SELECT o.id FROM outbox o"
    " WHERE o.id = (SELECT min(h.id) FROM outbox h WHERE h.instance = ? AND h.chat = ?"
    "               AND h.state IN ('pending', 'claimed'))"
    " AND ((o.state = 'pending' AND o.not_before <= ?) OR (o.state = 'claimed' AND o.lease_until <= ?))"
)
TAKE = (
    "UPDATE outbox SET state = 'claimed', lease_owner = ?, lease_until = ?, attempts = attempts + 1"
    " WHERE id = ?"
)
ITEM = (
    "SELECT id, instance, chat, kind, body, file_path, reply_to, attempts, coalesce(session_id, 0), parts_sent,"
    " created_at, approval_id, coalesce(turn_id, 0) FROM outbox WHERE id = ?"
)
PROGRESS = (
    "UPDATE outbox SET parts_sent = ?, platform_msg_id = ? WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
RENEW = "UPDATE outbox SET lease_until = ? WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
SENT = (
    "UPDATE outbox SET state = 'sent', sent_at = ?, platform_msg_id = ?, lease_owner = NULL,"
    " lease_until = NULL, error = '' WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
RETRY = (
    "UPDATE outbox SET state = 'pending', not_before = ?, error = ?, lease_owner = NULL, lease_until = NULL"
    " WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
FAIL = (
    "UPDATE outbox SET state = 'failed', error = ?, lease_owner = NULL, lease_until = NULL"
    " WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
RELEASE = (
    "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL,"
    " attempts = max(attempts - 1, 0) WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
TAKE_BACK = (  # a crashed holder's rows: its attempt counts (the call it was in may have gone out)
    "UPDATE outbox SET state = 'pending', lease_owner = NULL, lease_until = NULL"
    " WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
# a status only moves forward: sent < delivered < read; failed unless it was already read
DELIVERY = (
    "UPDATE outbox SET delivery = ?1,"
    " error = CASE WHEN ?1 = 'failed' AND ?2 != '' THEN ?2 ELSE error END"
    " WHERE instance = ?3 AND platform_msg_id = ?4 AND platform_msg_id != ''"
    " AND (CASE delivery WHEN 'read' THEN 3 WHEN 'delivered' THEN 2 WHEN 'sent' THEN 1 WHEN 'failed' THEN 4 ELSE 0 END)"
    "   < (CASE ?1 WHEN 'read' THEN 3 WHEN 'delivered' THEN 2 WHEN 'sent' THEN 1 WHEN 'failed' THEN 4 ELSE 0 END)"
    " AND NOT (delivery = 'read' AND ?1 = 'failed')"
)
DELIVERY_OF = "SELECT delivery, error FROM outbox WHERE instance = ? AND platform_msg_id = ?"
HELD_BY = "SELECT id FROM outbox WHERE state = 'claimed' AND lease_owner = ?"
GET = (
    "SELECT id, instance, chat, kind, body, file_path, state, attempts, error, platform_msg_id,"
    " created_at, sent_at FROM outbox WHERE id = ?"
)
FOR_CHAT = (
    "SELECT id, instance, chat, kind, body, file_path, state, attempts, error, platform_msg_id,"
    " created_at, sent_at FROM outbox WHERE instance = ? AND chat = ? ORDER BY id"
)
COUNT_BY_STATE = "SELECT state, count(*) FROM outbox GROUP BY state"
TIMES = (
    "SELECT id, coalesce(turn_id, 0), chat, state, created_at, sent_at FROM outbox"
    " WHERE instance = ? AND created_at >= ? ORDER BY id"
)


class Item(NamedTuple):
    """A claimed row, as a gateway needs it."""

    id: int
    instance: str
    chat: str
    kind: str
    body: str
    file_path: str
    reply_to: str
    attempt: int
    session_id: int
    parts_sent: int
    created_at: float
    approval_id: str = ""
    turn_id: int = 0  # the turn it answers (0: none, e.g. a pairing notice); a draft of that turn is its


class Row(NamedTuple):
    id: int
    instance: str
    chat: str
    kind: str
    body: str
    file_path: str
    state: str
    attempts: int
    error: str
    platform_msg_id: str
    created_at: float
    sent_at: float | None


def enqueue(
    conn: apsw.Connection,
    session_id: int | None,
    turn_id: int | None,
    instance: str,
    chat: str,
    text: str,
    file_path: str,
    reply_to: str,
    now: float,
    approval_id: str = "",
) -> int:
    kind = "file" if file_path else "text"
    conn.execute(ENQUEUE, (session_id, turn_id, instance, chat, kind, text, file_path, reply_to, now, approval_id))
    return conn.last_insert_rowid()


def claim(
    conn: apsw.Connection, instances: list[str], worker: str, limit: int, lease_s: float, now: float,
    chats: list[str] | None = None,
) -> list[Item]:
    """Lease the deliverable head of each chat's queue; ``chats`` narrows it to those chats. ``now`` is the
    writer's lease clock: lease_until and not_before are on it."""
    items: list[Item] = []
    for instance in instances:
        if len(items) >= limit:
            break
        if chats:
            ids = [row[0] for chat in chats for row in conn.execute(CLAIMABLE_CHAT, (instance, chat, now, now))]
            ids = ids[: limit - len(items)]
        else:
            ids = [row[0] for row in conn.execute(CLAIMABLE, (instance, now, now, limit - len(items)))]
        for outbox_id in ids:
            conn.execute(TAKE, (worker, now + lease_s, outbox_id))
            items.append(Item(*conn.execute(ITEM, (outbox_id,)).fetchone()))
    return items


def renew(conn: apsw.Connection, outbox_id: int, worker: str, lease_s: float, now: float) -> float | None:
    until = now + lease_s
    conn.execute(RENEW, (until, outbox_id, worker))
    return until if conn.changes() else None


def progress(conn: apsw.Connection, outbox_id: int, worker: str, parts_sent: int, platform_msg_id: str) -> bool:
    conn.execute(PROGRESS, (parts_sent, platform_msg_id, outbox_id, worker))
    return conn.changes() > 0


def mark_sent(conn: apsw.Connection, outbox_id: int, worker: str, platform_msg_id: str, now: float) -> bool:
    conn.execute(SENT, (now, platform_msg_id, outbox_id, worker))
    return conn.changes() > 0


def mark_failed(
    conn: apsw.Connection, outbox_id: int, worker: str, error: str, retry_after_s: float, now: float
) -> bool:
    """Retry after ``retry_after_s`` seconds (``now``: the lease clock, as not_before is), or fail for good
    when it is negative."""
    if retry_after_s < 0:
        conn.execute(FAIL, (error, outbox_id, worker))
    else:
        conn.execute(RETRY, (now + retry_after_s, error, outbox_id, worker))
    return conn.changes() > 0


def release(conn: apsw.Connection, outbox_id: int, worker: str, untouched: bool = True) -> bool:
    """Back to pending. ``untouched``: the holder never tried it, so the attempt is given back too."""
    conn.execute(RELEASE if untouched else TAKE_BACK, (outbox_id, worker))
    return conn.changes() > 0


def record_delivery(conn: apsw.Connection, instance: str, platform_msg_id: str, status: str, error: str) -> bool:
    conn.execute(DELIVERY, (status, error, instance, platform_msg_id))
    return conn.changes() > 0


def delivery_of(conn: apsw.Connection, instance: str, platform_msg_id: str) -> tuple[str, str] | None:
    row = conn.execute(DELIVERY_OF, (instance, platform_msg_id)).fetchone()
    return None if row is None else (row[0], row[1])


def held_by(conn: apsw.Connection, worker: str) -> list[int]:
    return [row[0] for row in conn.execute(HELD_BY, (worker,))]


def get(conn: apsw.Connection, outbox_id: int) -> Row | None:
    row = conn.execute(GET, (outbox_id,)).fetchone()
    return None if row is None else Row(*row)


def for_chat(conn: apsw.Connection, instance: str, chat: str) -> list[Row]:
    return [Row(*row) for row in conn.execute(FOR_CHAT, (instance, chat))]


def count_by_state(conn: apsw.Connection) -> dict[str, int]:
    return {state: n for state, n in conn.execute(COUNT_BY_STATE)}


def times(conn: apsw.Connection, instance: str, since: float) -> list[tuple[int, int, str, str, float, float | None]]:
    """(id, turn id or 0, chat, state, created_at, sent_at) of one instance's rows created since ``since``."""
    return [tuple(row) for row in conn.execute(TIMES, (instance, since))]
