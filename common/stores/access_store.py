"""Sender access: who may reach an agent through a gateway instance, and pairing codes for strangers."""

from __future__ import annotations

from typing import NamedTuple

import apsw

ALLOWED = "SELECT 1 FROM sender_access WHERE instance = ? AND sender = ? AND state = 'allowed'"
ALLOW = (
    "INSERT INTO sender_access (instance, sender, state, created_at, created_by) VALUES (?, ?, 'allowed', ?, ?)"
    " ON CONFLICT (instance, sender) DO UPDATE SET state = 'allowed', created_by = excluded.created_by"
)
CODE_FOR_SENDER = (
    "SELECT code, instance, sender, chat, sender_name, created_at, expires_at, approved_at FROM pairing_codes"
    " WHERE instance = ? AND sender = ? AND approved_at IS NULL AND expires_at > ? ORDER BY created_at DESC LIMIT 1"
)
COUNT_PENDING = (
    "SELECT count(*) FROM pairing_codes WHERE instance = ? AND approved_at IS NULL AND expires_at > ?"
)
CREATE_CODE = (
    "INSERT INTO pairing_codes (code, instance, sender, chat, sender_name, created_at, expires_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
GET_CODE = (
    "SELECT code, instance, sender, chat, sender_name, created_at, expires_at, approved_at FROM pairing_codes"
    " WHERE code = ?"
)
APPROVE_CODE = "UPDATE pairing_codes SET approved_at = ? WHERE code = ? AND approved_at IS NULL"
PENDING = (
    "SELECT code, instance, sender, chat, sender_name, created_at, expires_at, approved_at FROM pairing_codes"
    " WHERE approved_at IS NULL AND expires_at > ? ORDER BY created_at"
)
EXPIRE_CODE = "UPDATE pairing_codes SET expires_at = ? WHERE code = ? AND approved_at IS NULL"
REVOKE = "DELETE FROM sender_access WHERE instance = ? AND sender = ? AND state = 'allowed'"
ALLOWED_LIST = (
    "SELECT instance, sender, created_at, created_by FROM sender_access WHERE state = 'allowed'"
    " ORDER BY instance, created_at"
)


class Code(NamedTuple):
    code: str
    instance: str
    sender: str
    chat: str
    sender_name: str
    created_at: float
    expires_at: float
    approved_at: float | None


def is_allowed(conn: apsw.Connection, instance: str, sender: str) -> bool:
    return conn.execute(ALLOWED, (instance, sender)).fetchone() is not None


def allow(conn: apsw.Connection, instance: str, sender: str, by: str, now: float) -> None:
    conn.execute(ALLOW, (instance, sender, now, by))


def code_for_sender(conn: apsw.Connection, instance: str, sender: str, now: float) -> Code | None:
    row = conn.execute(CODE_FOR_SENDER, (instance, sender, now)).fetchone()
    return None if row is None else Code(*row)


def count_pending(conn: apsw.Connection, instance: str, now: float) -> int:
    return int(conn.execute(COUNT_PENDING, (instance, now)).fetchall()[0][0])


def create_code(conn: apsw.Connection, code: str, instance: str, sender: str, chat: str, sender_name: str,
                now: float, ttl_s: float) -> Code:
    conn.execute(CREATE_CODE, (code, instance, sender, chat, sender_name, now, now + ttl_s))
    return Code(code, instance, sender, chat, sender_name, now, now + ttl_s, None)


def get_code(conn: apsw.Connection, code: str) -> Code | None:
    row = conn.execute(GET_CODE, (code,)).fetchone()
    return None if row is None else Code(*row)


def approve_code(conn: apsw.Connection, code: str, now: float) -> bool:
    conn.execute(APPROVE_CODE, (now, code))
    return conn.changes() > 0


def pending(conn: apsw.Connection, now: float) -> list[Code]:
    return [Code(*row) for row in conn.execute(PENDING, (now,))]


class Allowed(NamedTuple):
    instance: str
    sender: str
    created_at: float
    created_by: str


def expire_code(conn: apsw.Connection, code: str, now: float) -> bool:
    """A refused code ends now (its sender may ask for a new one later)."""
    conn.execute(EXPIRE_CODE, (now, code))
    return conn.changes() > 0


def revoke(conn: apsw.Connection, instance: str, sender: str) -> bool:
    """The sender may no longer reach the instance's agent (a stranger again: a pairing code next time)."""
    conn.execute(REVOKE, (instance, sender))
    return conn.changes() > 0


def allowed(conn: apsw.Connection) -> list[Allowed]:
    """Every allowed sender, by instance."""
    return [Allowed(*row) for row in conn.execute(ALLOWED_LIST)]
