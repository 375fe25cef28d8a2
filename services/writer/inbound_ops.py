"""A person's message from a gateway (schema Inbound): stored once as a pending user turn, deduped on the
platform's event ids.

``store_run`` stores several consecutive ones of a group commit with a handful of statements (one dedupe
lookup, one executemany each for the turns and their keys, one session lookup per chat) instead of five
per message: most of a busy writer's requests are these, and per-statement overhead was a third of
their cost. A run in which one is refused raises, and the group commit then applies them one by one in
savepoints (group_commit.py), each through ``store_one``: the same code, a run of one.
"""

from __future__ import annotations

import msgspec

from common.redact import redact
from common.stores import keys_store, session_store, turn_store
from schema import messages as m
from services.writer import apply as _apply  # Rejected, Pending (apply imports this module: looked up at call time)

_json = msgspec.json.Encoder()


def _check(op: m.Inbound) -> None:
    if not op.dedupe_keys:
        raise _apply.Rejected("invalid", "an inbound message needs at least one dedupe key (the platform's event id)")
    if op.chat_kind not in m.CHAT_KINDS:
        raise _apply.Rejected("invalid", f"chat_kind must be one of {', '.join(m.CHAT_KINDS)}, not {op.chat_kind!r}")


def _row(turn_id: int, session_id: int, op: m.Inbound, now: float) -> tuple:
    # a secret a person pastes into a chat is not kept in turns or the FTS index either
    return (turn_id, session_id, redact(op.text), op.sender, op.sender_name, op.platform_msg_id, op.reply_to,
            _json.encode(op.attachments).decode(), "{}", now, op.thread, op.chat_kind, op.edit_of, op.sent_at)


def store_one(conn, op: m.Inbound, now: float, events: list) -> m.Accepted:
    """One message (the savepoint pass, a cron fire): a run of one."""
    return store_run(conn, [op], now, events)[0]


def store_run(conn, ops: list[m.Inbound], now: float, events: list) -> list[m.Accepted]:
    """Each message in order, in the caller's transaction: one whose event id came earlier in the run, or is
    stored already, is answered as a duplicate of that turn (its first key that is known decides)."""
    known = keys_store.inbound_turns(conn, _json.encode([key for op in ops for key in op.dedupe_keys]).decode())
    session_of_new: dict[int, int] = {}  # turn stored by this run -> its session
    sessions: dict[tuple[str, str, str], int] = {}  # one open_session per chat (the same `now` touches once)
    next_id = turn_store.next_id(conn)
    rows, keys, answers = [], [], []
    for op in ops:
        first = next((known[key] for key in op.dedupe_keys if key in known), None)
        if first is not None:
            session_id = session_of_new.get(first) or turn_store.session_of(conn, first) or 0
            answers.append(m.Accepted(turn_id=first, session_id=session_id, duplicate=True))
            continue
        _check(op)
        chat = (op.agent, op.instance, op.chat)
        session_id = sessions.get(chat)
        if session_id is None:
            session_id = sessions[chat] = session_store.open_session(conn, op.agent, op.instance, op.chat, now)
        turn_id, next_id = next_id, next_id + 1
        rows.append(_row(turn_id, session_id, op, now))
        for key in op.dedupe_keys:
            known.setdefault(key, turn_id)  # INSERT OR IGNORE: a key repeated within one message counts once
            keys.append((key, turn_id, now))
        session_of_new[turn_id] = session_id
        events.append((m.TOPIC_TURN, m.TurnPending, {"session_id": session_id, "turn_id": turn_id}))
        answers.append(m.Accepted(turn_id=turn_id, session_id=session_id))
    turn_store.add_user_turns_at(conn, rows)
    keys_store.remember_inbound_many(conn, keys)
    return answers
