"""Turns: pending user turns as a work queue with leases, and the history of every conversation."""

from __future__ import annotations

from typing import NamedTuple

import apsw

MAX_ATTEMPTS = 5  # a turn whose runner died this often is failed instead of taken again
MAX_CRASHES = 3  # a turn that killed the runner holding it alone this often is failed (a poison turn)
QUARANTINED = "(t.crashes > 0 OR t.suspect > 0)"  # held when its runner died: it runs alone from then on

INSERT_USER_AT = (  # with the id given (next_id onwards): several user turns stored by one executemany
    "INSERT INTO turns (id, session_id, role, content, sender, sender_name, platform_msg_id, reply_to,"
    " attachments, meta, state, created_at, thread, chat_kind, edit_of, sent_at)"
    " VALUES (?, ?, 'user', ?, ?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?)"
)
NEXT_ID = "SELECT coalesce(max(id), 0) + 1 FROM turns"
INBOUND_FIELDS = "SELECT thread, chat_kind, edit_of, sent_at, reply_to FROM turns WHERE id = ?"
INSERT_OTHER = (
    "INSERT INTO turns (session_id, parent_id, role, content, meta, created_at) VALUES (?, ?, ?, ?, ?, ?)"
)
# The head of each session's queue is its lowest unfinished turn; it can be taken when pending or
# when its holder's lease ran out. Later turns of that session wait for it (order, one at a time).
NEXT_CLAIMABLE = (
    "SELECT t.id, t.attempts FROM turns t"
    " WHERE t.state IN ('pending', 'claimed') AND (t.state = 'pending' OR t.lease_until <= ?)"
    " AND t.id = (SELECT min(h.id) FROM turns h"
    "             WHERE h.session_id = t.session_id AND h.state IN ('pending', 'claimed'))"
    # a turn put back ahead of one already running (an approval decided meanwhile) waits for it
    # (state IN (...) too, so that SQLite uses the partial index turns_work, not a scan of the session)
    " AND NOT EXISTS (SELECT 1 FROM turns c WHERE c.session_id = t.session_id"
    "                 AND c.state IN ('pending', 'claimed') AND c.state = 'claimed'"
    "                 AND c.lease_until > ? AND c.id != t.id)"
    # a quarantined turn goes only to a runner that holds nothing else (?3), and first to it
    " AND (?3 OR NOT " + QUARANTINED + ")"
    " ORDER BY CASE WHEN ?3 AND " + QUARANTINED + " THEN 0 ELSE 1 END, t.id LIMIT 1"
)
QUARANTINE_WAITING = (  # a quarantined turn at the head of its session, waiting for a runner alone
    "SELECT 1 FROM turns t WHERE t.state IN ('pending', 'claimed') AND t.state = 'pending' AND " + QUARANTINED +
    " AND t.id = (SELECT min(h.id) FROM turns h WHERE h.session_id = t.session_id"
    "             AND h.state IN ('pending', 'claimed')) LIMIT 1"
)
TAKE = (
    "UPDATE turns SET state = 'claimed', lease_owner = ?, lease_until = ?, attempts = attempts + 1"
    " WHERE id = ?"
)
GIVE_UP = (
    "UPDATE turns SET state = 'failed', lease_owner = NULL, lease_until = NULL, error = ?, done_at = ?"
    " WHERE id = ?"
)
CLAIM_DETAILS = (
    "SELECT t.id, t.session_id, s.agent, s.instance, s.chat, t.sender, t.content, t.attempts, t.lease_until,"
    " t.platform_msg_id, " + QUARANTINED + " FROM turns t JOIN sessions s ON s.id = t.session_id WHERE t.id = ?"
)
# a gone holder's turns back to the queue without costing an attempt; CRASHED: it held this one alone
CRASHED = (
    "UPDATE turns SET state = 'pending', lease_owner = NULL, lease_until = NULL, attempts = max(attempts - 1, 0),"
    " crashes = crashes + 1 WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
SUSPECTED = (
    "UPDATE turns SET state = 'pending', lease_owner = NULL, lease_until = NULL, attempts = max(attempts - 1, 0),"
    " suspect = 1 WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
CRASHES = "SELECT crashes, suspect FROM turns WHERE id = ?"
FAIL_WAITING = (  # a turn taken out of the queue for good (it crashed its runner too often)
    "UPDATE turns SET state = 'failed', lease_owner = NULL, lease_until = NULL, error = ?, done_at = ?"
    " WHERE id = ? AND state IN ('pending', 'claimed')"
)
EXPIRED_OWNERS = (
    "SELECT DISTINCT lease_owner FROM turns WHERE state IN ('pending', 'claimed') AND state = 'claimed'"
    " AND lease_until <= ?"
)
RENEW = (
    "UPDATE turns SET lease_until = ? WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
FINISH = (
    "UPDATE turns SET state = ?, error = ?, done_at = ?, lease_owner = NULL, lease_until = NULL"
    " WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
RELEASE = (
    "UPDATE turns SET state = 'pending', lease_owner = NULL, lease_until = NULL,"
    " attempts = max(attempts - 1, 0) WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
PARK = (
    "UPDATE turns SET state = 'waiting', lease_owner = NULL, lease_until = NULL"
    " WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
)
# a voice note's transcript takes the place of its line: only the runner holding the turn may rewrite it
SET_USER_TEXT = (
    "UPDATE turns SET content = ? WHERE id = ? AND role = 'user' AND state = 'claimed' AND lease_owner = ?"
)
UNPARK = "UPDATE turns SET state = 'pending', attempts = 0 WHERE id = ? AND state = 'waiting'"
SESSION_OF = "SELECT session_id FROM turns WHERE id = ?"
HELD = "SELECT session_id FROM turns WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
HELD_BY = (  # state IN (...): through the partial index turns_work, not a scan of every turn
    "SELECT id, session_id FROM turns WHERE state IN ('pending', 'claimed') AND state = 'claimed' AND lease_owner = ?"
    " ORDER BY id"
)
HAS_WORK = "SELECT 1 FROM turns WHERE state IN ('pending', 'claimed') AND session_id = ? LIMIT 1"
GET = (
    "SELECT id, session_id, role, content, sender, state, attempts, error, meta, created_at"
    " FROM turns WHERE id = ?"
)
USER_TURNS_FOR_CHAT = (
    "SELECT t.id, t.session_id, t.role, t.content, t.sender, t.state, t.attempts, t.error, t.meta, t.created_at"
    " FROM turns t JOIN sessions s ON s.id = t.session_id"
    " WHERE s.instance = ? AND s.chat = ? AND t.role = 'user' ORDER BY t.id"
)
CONVERSATION = (
    "SELECT id, session_id, role, content, sender, state, attempts, error, meta, created_at, attachments FROM turns"
    " WHERE session_id = ? AND coalesce(parent_id, id) <= ? AND coalesce(parent_id, id) > ?"
    " ORDER BY coalesce(parent_id, id) DESC, id DESC LIMIT ?"
)
COUNT_IN_SESSION = "SELECT count(*) FROM turns WHERE session_id = ?"
COUNT = "SELECT count(*) FROM turns"
COUNT_BY_STATE = "SELECT state, count(*) FROM turns WHERE state IS NOT NULL GROUP BY state"
INSERT_DONE_USER = (
    "INSERT INTO turns (session_id, role, content, sender, state, created_at, done_at)"
    " VALUES (?, 'user', ?, ?, 'done', ?, ?)"
)
USER_TURN_TIMES = (
    "SELECT t.id, s.chat, t.state, t.created_at FROM turns t JOIN sessions s ON s.id = t.session_id"
    " WHERE s.instance = ? AND t.role = 'user' AND t.created_at >= ? ORDER BY t.id"
)
INSERT_RAW = (
    "INSERT INTO turns (session_id, role, content, sender, state, created_at)"
    " VALUES (?, 'user', ?, ?, 'pending', ?)"
)


class Turn(NamedTuple):
    id: int
    session_id: int
    role: str
    content: str
    sender: str
    state: str | None
    attempts: int
    error: str
    meta: str
    created_at: float
    attachments: str = "[]"  # JSON list of paths (read by ``conversation`` only)


class Claim(NamedTuple):
    turn_id: int
    session_id: int
    agent: str
    instance: str
    chat: str
    sender: str
    text: str
    attempt: int
    lease_until: float
    platform_msg_id: str  # the platform's id of the message this turn answers ("" for none)
    alone: bool = False  # its runner died holding it: run it alone (claim nothing beside it)


def add_user_turn(
    conn: apsw.Connection,
    session_id: int,
    text: str,
    sender: str,
    sender_name: str,
    platform_msg_id: str,
    reply_to: str,
    attachments_json: str,
    meta: str,
    now: float,
    *,
    thread: str = "",
    chat_kind: str = "",
    edit_of: str = "",
    sent_at: float = 0.0,
) -> int:
    turn_id = next_id(conn)
    add_user_turns_at(conn, [(turn_id, session_id, text, sender, sender_name, platform_msg_id, reply_to,
                              attachments_json, meta, now, thread, chat_kind, edit_of, sent_at)])
    return turn_id


def next_id(conn: apsw.Connection) -> int:
    """The id the next turn stored gets: turns.id is a rowid without AUTOINCREMENT, so max + 1."""
    return int(conn.execute(NEXT_ID).fetchone()[0])


def add_user_turns_at(conn: apsw.Connection, rows: list[tuple]) -> None:
    """Several pending user turns in one executemany, each row ``(id, session_id, text, sender,
    sender_name, platform_msg_id, reply_to, attachments_json, meta, now, thread, chat_kind, edit_of,
    sent_at)``: ``add_user_turn``'s columns with the id the caller chose (``next_id`` onwards)."""
    conn.executemany(INSERT_USER_AT, rows)


class InboundFields(NamedTuple):
    """What the gateway said of a user turn's message (schema Inbound), in columns of their own."""

    thread: str
    chat_kind: str
    edit_of: str
    sent_at: float
    reply_to: str


def inbound_fields(conn: apsw.Connection, turn_id: int) -> InboundFields | None:
    row = conn.execute(INBOUND_FIELDS, (turn_id,)).fetchone()
    return InboundFields(*row) if row else None


def add_turn(conn: apsw.Connection, session_id: int, role: str, content: str, meta: str, now: float,
             parent_id: int | None = None) -> int:
    """A turn that is not work: an answer, a tool call or result, a summary, under user turn ``parent_id``."""
    conn.execute(INSERT_OTHER, (session_id, parent_id, role, content, meta, now))
    return conn.last_insert_rowid()


def claim_next(conn: apsw.Connection, worker: str, lease_s: float, now: float,
               lease_now: float | None = None, alone: bool = False, gave_up: list[int] | None = None) -> Claim | None:
    """Lease the next turn that may run; a turn that exhausted MAX_ATTEMPTS is failed and skipped (its id
    appended to ``gave_up``). Leases are judged and written on ``lease_now`` (the writer's lease clock;
    ``now``, the wall time stamped on a failure, when not given). A quarantined turn (``alone``) goes only
    to a worker that holds nothing else, and first to it."""
    lease_now = now if lease_now is None else lease_now
    while True:
        row = conn.execute(NEXT_CLAIMABLE, (lease_now, lease_now, int(alone))).fetchone()
        if row is None:
            return None
        turn_id, attempts = row
        if attempts >= MAX_ATTEMPTS:
            conn.execute(GIVE_UP, (f"gave up after {attempts} attempts", now, turn_id))
            if gave_up is not None:
                gave_up.append(turn_id)
            continue
        conn.execute(TAKE, (worker, lease_now + lease_s, turn_id))
        return details(conn, turn_id)


def details(conn: apsw.Connection, turn_id: int) -> Claim | None:
    """A turn as a claim shows it (its session's agent, instance and chat, the message it answers)."""
    row = conn.execute(CLAIM_DETAILS, (turn_id,)).fetchone()
    return None if row is None else Claim(*row[:-1], alone=bool(row[-1]))


def quarantine_waiting(conn: apsw.Connection) -> bool:
    """Whether a quarantined turn waits at the head of its session for a worker holding nothing else."""
    return conn.execute(QUARANTINE_WAITING).fetchone() is not None


def take_back(conn: apsw.Connection, turn_id: int, worker: str, crashed: str = "") -> bool:
    """A gone holder's turn is pending again, its attempt given back. ``crashed``: "alone" (it died holding
    only this one: a crash of this turn's doing) or "among" (holding others too: a suspect); "" (it left
    cleanly) marks nothing."""
    if crashed == "alone":
        conn.execute(CRASHED, (turn_id, worker))
    elif crashed == "among":
        conn.execute(SUSPECTED, (turn_id, worker))
    else:
        conn.execute(RELEASE, (turn_id, worker))
    return conn.changes() > 0


def crashes(conn: apsw.Connection, turn_id: int) -> tuple[int, bool]:
    """(crashes of its own, suspect) of a turn."""
    row = conn.execute(CRASHES, (turn_id,)).fetchone()
    return (0, False) if row is None else (int(row[0]), bool(row[1]))


def fail_waiting(conn: apsw.Connection, turn_id: int, error: str, now: float) -> bool:
    conn.execute(FAIL_WAITING, (error, now, turn_id))
    return conn.changes() > 0


def expired_owners(conn: apsw.Connection, lease_now: float) -> list[str]:
    """The workers holding a turn whose lease ran out."""
    return [row[0] for row in conn.execute(EXPIRED_OWNERS, (lease_now,)) if row[0]]


def renew(conn: apsw.Connection, turn_id: int, worker: str, lease_s: float, now: float) -> float | None:
    """The new lease end, or None when the worker no longer holds the turn."""
    until = now + lease_s
    conn.execute(RENEW, (until, turn_id, worker))
    return until if conn.changes() else None


def finish(conn: apsw.Connection, turn_id: int, worker: str, ok: bool, error: str, now: float) -> bool:
    """Mark a claimed turn done or failed; False when the worker lost its lease to another."""
    conn.execute(FINISH, ("done" if ok else "failed", error, now, turn_id, worker))
    return conn.changes() > 0


def release(conn: apsw.Connection, turn_id: int, worker: str) -> bool:
    conn.execute(RELEASE, (turn_id, worker))
    return conn.changes() > 0


def park(conn: apsw.Connection, turn_id: int, worker: str) -> bool:
    """A claimed turn waits for a person (an approval): the lease is released, the session moves on."""
    conn.execute(PARK, (turn_id, worker))
    return conn.changes() > 0


def unpark(conn: apsw.Connection, turn_id: int) -> bool:
    """The decision came: the turn is pending again, ahead of the session's later turns."""
    conn.execute(UNPARK, (turn_id,))
    return conn.changes() > 0


def held_by(conn: apsw.Connection, turn_id: int, worker: str) -> int | None:
    """The session of a turn this worker holds a claim on, else None."""
    row = conn.execute(HELD, (turn_id, worker)).fetchone()
    return None if row is None else int(row[0])


def held_turns(conn: apsw.Connection, worker: str) -> list[tuple[int, int]]:
    """(turn id, session id) of every turn ``worker`` holds a claim on."""
    return [(row[0], row[1]) for row in conn.execute(HELD_BY, (worker,))]


def has_work(conn: apsw.Connection, session_id: int) -> bool:
    """Whether the session has a turn waiting or running (a finished turn wakes runners only then)."""
    return conn.execute(HAS_WORK, (session_id,)).fetchone() is not None


def session_of(conn: apsw.Connection, turn_id: int) -> int | None:
    row = conn.execute(SESSION_OF, (turn_id,)).fetchone()
    return None if row is None else int(row[0])


def get(conn: apsw.Connection, turn_id: int) -> Turn | None:
    row = conn.execute(GET, (turn_id,)).fetchone()
    return None if row is None else Turn(*row)


def user_turns_for_chat(conn: apsw.Connection, instance: str, chat: str) -> list[Turn]:
    """Every user turn a chat of a gateway instance sent, across its sessions, oldest first."""
    return [Turn(*row) for row in conn.execute(USER_TURNS_FOR_CHAT, (instance, chat))]


def history(conn: apsw.Connection, session_id: int, up_to: int, limit: int) -> list[Turn]:
    """The last ``limit`` turns of a session in conversation order, up to user turn ``up_to`` and what
    answered it, oldest first."""
    return conversation(conn, session_id, up_to, 0, limit)


def conversation(conn: apsw.Connection, session_id: int, up_to_turn: int, after_id: int, limit: int) -> list[Turn]:
    """What a model sees when answering user turn ``up_to_turn``: each user turn followed by the turns
    that answered it (whatever arrived in between), from the user turns after ``after_id`` (the
    compaction summary covers those up to it), the last ``limit`` of them, oldest first."""
    rows = conn.execute(CONVERSATION, (session_id, up_to_turn, after_id, limit)).fetchall()
    return [Turn(*row) for row in reversed(rows)]


def set_user_text(conn: apsw.Connection, turn_id: int, worker: str, content: str) -> bool:
    """Rewrite a claimed user turn's text (the FTS index follows by trigger); False unless ``worker`` holds it."""
    conn.execute(SET_USER_TEXT, (content, turn_id, worker))
    return conn.changes() > 0


def count_in_session(conn: apsw.Connection, session_id: int) -> int:
    return int(conn.execute(COUNT_IN_SESSION, (session_id,)).fetchall()[0][0])


def count(conn: apsw.Connection) -> int:
    return int(conn.execute(COUNT).fetchall()[0][0])


def count_by_state(conn: apsw.Connection) -> dict[str, int]:
    return {state: n for state, n in conn.execute(COUNT_BY_STATE)}


def insert_raw(conn: apsw.Connection, rows: list[tuple[int, str, str, float]]) -> None:
    """Bulk insert of (session_id, content, sender, created_at) user turns: the benchmark's baseline."""
    conn.executemany(INSERT_RAW, rows)


def add_exchanges(conn: apsw.Connection, session_id: int, exchanges: list[tuple[str, str, str, float]]) -> int:
    """Bulk history of (user text, sender, answer, created_at): a done user turn and its assistant answer
    each, as a finished conversation leaves them (the turns benchmark's long session). Returns the count."""
    for text, sender, answer, created_at in exchanges:
        conn.execute(INSERT_DONE_USER, (session_id, text, sender, created_at, created_at))
        conn.execute(INSERT_OTHER, (session_id, conn.last_insert_rowid(), "assistant", answer, "{}", created_at))
    return 2 * len(exchanges)


def user_turn_times(conn: apsw.Connection, instance: str, since: float) -> list[tuple[int, str, str, float]]:
    """(turn id, chat, state, created_at) of the user turns of one gateway instance created since ``since``."""
    return [tuple(row) for row in conn.execute(USER_TURN_TIMES, (instance, since))]
