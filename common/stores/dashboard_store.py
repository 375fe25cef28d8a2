"""Dashboard accounts, their sessions and failed logins, the audit rows of what was done from the dashboard,
and the daemon log (every service's warnings and errors)."""

from __future__ import annotations

from typing import NamedTuple

import apsw

_ACCOUNT = "id, username, password_hash, role, created_at, last_login_at, failed_logins, locked_until"
ACCOUNT = "SELECT " + _ACCOUNT + " FROM dashboard_accounts WHERE username = ?"
ACCOUNTS = "SELECT " + _ACCOUNT + " FROM dashboard_accounts ORDER BY username"
ACCOUNT_COUNT = "SELECT count(*) FROM dashboard_accounts"
ADD_ACCOUNT = "INSERT INTO dashboard_accounts (username, password_hash, role, created_at) VALUES (?, ?, ?, ?)"
SET_PASSWORD = "UPDATE dashboard_accounts SET password_hash = ?, failed_logins = 0, locked_until = 0 WHERE id = ?"
SET_ROLE = "UPDATE dashboard_accounts SET role = ? WHERE id = ?"
REMOVE_ACCOUNT = "DELETE FROM dashboard_accounts WHERE id = ?"
LOGIN_OK = "UPDATE dashboard_accounts SET last_login_at = ?, failed_logins = 0, locked_until = 0 WHERE id = ?"
LOGIN_FAILED = (
    "UPDATE dashboard_accounts SET failed_logins = failed_logins + 1,"
    " locked_until = CASE WHEN failed_logins + 1 >= ? THEN ? ELSE locked_until END"
    " WHERE id = ? RETURNING failed_logins, locked_until"
)

OPEN_SESSION = (
    "INSERT INTO dashboard_sessions (token_hash, account_id, csrf, address, created_at, expires_at)"
    " VALUES (?, ?, ?, ?, ?, ?)"
)
SESSION = (
    "SELECT s.token_hash, s.csrf, s.expires_at, a.id, a.username, a.role FROM dashboard_sessions s"
    " JOIN dashboard_accounts a ON a.id = s.account_id WHERE s.token_hash = ? AND s.expires_at > ?"
)
CLOSE_SESSION = "DELETE FROM dashboard_sessions WHERE token_hash = ?"
CLOSE_SESSIONS_OF = "DELETE FROM dashboard_sessions WHERE account_id = ?"
DROP_EXPIRED_SESSIONS = "DELETE FROM dashboard_sessions WHERE expires_at <= ?"
SESSION_COUNT = "SELECT count(*) FROM dashboard_sessions WHERE account_id = ? AND expires_at > ?"

AUDIT = "INSERT INTO audit (at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)"
RECENT_AUDIT = (
    "SELECT id, at, actor, action, target, detail FROM audit WHERE action LIKE 'dashboard.%'"
    " ORDER BY id DESC LIMIT ?"
)

ADD_LOG = "INSERT INTO daemon_log (at, service, level, event, detail) VALUES (?, ?, ?, ?, ?)"
PRUNE_LOG_BEFORE = "DELETE FROM daemon_log WHERE at < ?"
# ids grow with inserts: everything below the newest max_rows ids goes (the primary key, no count)
PRUNE_LOG_BEYOND = "DELETE FROM daemon_log WHERE id <= (SELECT max(id) FROM daemon_log) - ?"
LOG_LINES = (
    "SELECT id, at, service, level, event, detail FROM daemon_log"
    " WHERE at >= ? AND (? = '' OR service = ? OR service LIKE ? || '-%') AND level IN ({levels})"
    " ORDER BY at DESC, id DESC LIMIT ?"
)
LOG_SERVICES = "SELECT DISTINCT service FROM daemon_log ORDER BY service"


class Account(NamedTuple):
    id: int
    username: str
    password_hash: str
    role: str
    created_at: float
    last_login_at: float | None
    failed_logins: int
    locked_until: float


class Session(NamedTuple):
    token_hash: str
    csrf: str
    expires_at: float
    account_id: int
    username: str
    role: str


class AuditRow(NamedTuple):
    id: int
    at: float
    actor: str
    action: str
    target: str
    detail: str


class LogRow(NamedTuple):
    id: int
    at: float
    service: str
    level: str
    event: str
    detail: str


# ------------------------------------------------------------------ accounts


def account(conn: apsw.Connection, username: str) -> Account | None:
    row = conn.execute(ACCOUNT, (username,)).fetchone()
    return None if row is None else Account(*row)


def accounts(conn: apsw.Connection) -> list[Account]:
    return [Account(*row) for row in conn.execute(ACCOUNTS)]


def account_count(conn: apsw.Connection) -> int:
    return int(conn.execute(ACCOUNT_COUNT).fetchall()[0][0])


def add_account(conn: apsw.Connection, username: str, password_hash: str, role: str, now: float) -> int:
    conn.execute(ADD_ACCOUNT, (username, password_hash, role, now))
    return conn.last_insert_rowid()


def set_password(conn: apsw.Connection, account_id: int, password_hash: str) -> None:
    """A new password: the lockout ends, and so does every session of the account."""
    conn.execute(SET_PASSWORD, (password_hash, account_id))
    conn.execute(CLOSE_SESSIONS_OF, (account_id,))


def set_role(conn: apsw.Connection, account_id: int, role: str) -> None:
    conn.execute(SET_ROLE, (role, account_id))
    conn.execute(CLOSE_SESSIONS_OF, (account_id,))


def remove_account(conn: apsw.Connection, account_id: int) -> None:
    conn.execute(CLOSE_SESSIONS_OF, (account_id,))
    conn.execute(REMOVE_ACCOUNT, (account_id,))


def login_ok(conn: apsw.Connection, account_id: int, now: float) -> None:
    conn.execute(LOGIN_OK, (now, account_id))


def login_failed(conn: apsw.Connection, account_id: int, lock_after: int, locked_until: float) -> tuple[int, float]:
    """Count one more failure; at ``lock_after`` in a row the account is locked until ``locked_until``.
    (failures in a row, locked until)."""
    row = conn.execute(LOGIN_FAILED, (lock_after, locked_until, account_id)).fetchone()
    return int(row[0]), float(row[1])


# ------------------------------------------------------------------ sessions


def open_session(conn: apsw.Connection, token_hash: str, account_id: int, csrf: str, address: str, now: float,
                 expires_at: float) -> None:
    conn.execute(DROP_EXPIRED_SESSIONS, (now,))  # logins are rare: the table is kept small here
    conn.execute(OPEN_SESSION, (token_hash, account_id, csrf, address, now, expires_at))


def session(conn: apsw.Connection, token_hash: str, now: float) -> Session | None:
    row = conn.execute(SESSION, (token_hash, now)).fetchone()
    return None if row is None else Session(*row)


def close_session(conn: apsw.Connection, token_hash: str) -> bool:
    conn.execute(CLOSE_SESSION, (token_hash,))
    return conn.changes() > 0


def session_count(conn: apsw.Connection, account_id: int, now: float) -> int:
    return int(conn.execute(SESSION_COUNT, (account_id, now)).fetchall()[0][0])


# ------------------------------------------------------------------ audit


def audit(conn: apsw.Connection, at: float, actor: str, action: str, target: str, detail_json: str) -> int:
    conn.execute(AUDIT, (at, actor, action, target, detail_json))
    return conn.last_insert_rowid()


def recent_audit(conn: apsw.Connection, limit: int = 100) -> list[AuditRow]:
    """The dashboard's audit rows (logins, failures, changes), newest first."""
    return [AuditRow(*row) for row in conn.execute(RECENT_AUDIT, (limit,))]


# ------------------------------------------------------------------ the daemon log


def add_log_lines(conn: apsw.Connection, lines: list[tuple[float, str, str, str, str]], before: float,
                  max_rows: int) -> None:
    """Store (at, service, level, event, detail) rows; then the retention: rows older than ``before`` and
    beyond the newest ``max_rows`` are deleted."""
    conn.executemany(ADD_LOG, lines)
    if before > 0:
        conn.execute(PRUNE_LOG_BEFORE, (before,))
    if max_rows > 0:
        conn.execute(PRUNE_LOG_BEYOND, (max_rows,))


def log_lines(conn: apsw.Connection, since: float, levels: tuple[str, ...], service: str = "",
              limit: int = 200) -> list[LogRow]:
    """The newest lines first: since ``since``, at one of ``levels``, of ``service`` (or its group, as
    `runner` is runner-0, runner-1, ...; "" every service)."""
    levels = tuple(levels) or ("warning",)
    sql = LOG_LINES.format(levels=", ".join("?" * len(levels)))
    return [LogRow(*row) for row in conn.execute(sql, (since, service, service, service, *levels, limit))]


def log_services(conn: apsw.Connection) -> list[str]:
    return [row[0] for row in conn.execute(LOG_SERVICES)]
