"""The writer's side of the dashboard: account changes, logins and sessions, the dashboard's audit rows,
pairing refusals and revoked senders, and the daemon log. Every account change and every login, good or
not, leaves an audit row naming the account (and who acted); no password or hash is ever in one."""

from __future__ import annotations

import json

from common import dashboard_accounts as accounts
from common.errors import InvalidInput
from common.stores import access_store, dashboard_store
from schema import messages as m
from services.writer import apply as ops  # circular on purpose: apply dispatches here, this raises its Rejected

MAX_LOG_LINES = 1000  # per request: a service's batch is far smaller
MAX_AUDIT_DETAIL = 4000
ACTIONS = ("add", "passwd", "rm", "role")


def _audit(conn, now: float, actor: str, action: str, target: str, **detail) -> int:
    return dashboard_store.audit(conn, now, actor or "unknown", action, target, json.dumps(detail, sort_keys=True))


def account(conn, op: m.DashboardAccount, now: float) -> m.Stored:
    if op.action not in ACTIONS:
        raise ops.Rejected("invalid", f"action must be one of {', '.join(ACTIONS)}, not {op.action!r}")
    try:
        name = accounts.check_username(op.username)
        if op.action in ("add", "role"):
            accounts.check_role(op.role)
        if op.action in ("add", "passwd") and not accounts.is_hash(op.password_hash):
            raise InvalidInput("the password must come as an argon2id hash")
    except InvalidInput as exc:
        raise ops.Rejected("invalid", str(exc)) from None
    found = dashboard_store.account(conn, name)
    if op.action == "add":
        if found is not None:
            raise ops.Rejected("conflict", f"a dashboard account named {name!r} already exists")
        if op.first and dashboard_store.account_count(conn):
            raise ops.Rejected("conflict", "the first account was made already; this setup link is used up")
        account_id = dashboard_store.add_account(conn, name, op.password_hash, op.role, now)
        _audit(conn, now, op.by, "dashboard.account_added", name, role=op.role)
        return m.Stored(id=account_id)
    if found is None:
        raise ops.Rejected("not_found", f"no dashboard account named {name!r}")
    if op.action == "passwd":
        dashboard_store.set_password(conn, found.id, op.password_hash)
        _audit(conn, now, op.by, "dashboard.password_changed", name)
    elif op.action == "role":
        dashboard_store.set_role(conn, found.id, op.role)
        _audit(conn, now, op.by, "dashboard.role_changed", name, role=op.role, was=found.role)
    else:
        dashboard_store.remove_account(conn, found.id)
        _audit(conn, now, op.by, "dashboard.account_removed", name)
    return m.Stored(id=found.id)


def login(conn, op: m.DashboardLogin, now: float) -> m.LoginRecorded:
    found = dashboard_store.account(conn, op.username)
    address = op.address[:100]
    if op.ok:
        if found is None:
            raise ops.Rejected("not_found", f"no dashboard account named {op.username!r}")
        if len(op.token_hash) != 64 or not op.csrf or not now < op.expires_at <= now + 31 * 86400:
            raise ops.Rejected("invalid", "a session needs a token hash, a CSRF token and an expiry within 31 days")
        dashboard_store.login_ok(conn, found.id, now)
        dashboard_store.open_session(conn, op.token_hash, found.id, op.csrf, address, now, op.expires_at)
        _audit(conn, now, f"dashboard:{found.username}", "dashboard.login", found.username, address=address)
        return m.LoginRecorded()
    if op.lock_after < 1 or not 0 < op.lock_s <= 86400:
        raise ops.Rejected("invalid", "lock_after must be 1 or more and lock_s in (0, 86400]")
    reason = op.reason[:200] or "wrong password"
    if found is None:
        # the name is not kept: it may be a password typed into the wrong field
        _audit(conn, now, "dashboard:?", "dashboard.login_failed", "", address=address, reason=reason)
        return m.LoginRecorded()
    if found.locked_until > now:  # tries while locked are audited, not counted: the lock is not stretched
        _audit(conn, now, f"dashboard:{found.username}", "dashboard.login_failed", found.username, address=address,
               reason=reason, failures=found.failed_logins, locked=True)
        return m.LoginRecorded(failures=found.failed_logins, locked_until=found.locked_until)
    failures, locked_until = dashboard_store.login_failed(conn, found.id, op.lock_after, now + op.lock_s)
    _audit(conn, now, f"dashboard:{found.username}", "dashboard.login_failed", found.username, address=address,
           reason=reason, failures=failures, locked=locked_until > now)
    return m.LoginRecorded(failures=failures, locked_until=locked_until if locked_until > now else 0.0)


def logout(conn, op: m.DashboardLogout, now: float) -> m.Done:
    if dashboard_store.close_session(conn, op.token_hash) and op.by:
        _audit(conn, now, f"dashboard:{op.by}", "dashboard.logout", op.by)
    return m.Done()


def audit(conn, op: m.DashboardAudit, now: float) -> m.Stored:
    if not op.action or len(op.detail) > MAX_AUDIT_DETAIL:
        raise ops.Rejected("invalid", f"an audit row needs an action and at most {MAX_AUDIT_DETAIL} bytes of detail")
    try:
        detail = json.loads(op.detail)
    except ValueError:
        raise ops.Rejected("invalid", "detail must be a JSON object") from None
    if not isinstance(detail, dict):
        raise ops.Rejected("invalid", "detail must be a JSON object")
    action = op.action if op.action.startswith("dashboard.") else f"dashboard.{op.action}"
    return m.Stored(id=dashboard_store.audit(conn, now, f"dashboard:{op.account}", action, op.target[:500],
                                             op.detail))


def refuse_pairing(conn, op: m.RefusePairing, now: float) -> m.Done:
    code = access_store.get_code(conn, op.code.strip().upper())
    if code is None:
        raise ops.Rejected("not_found", f"no pairing code {op.code!r}")
    if code.approved_at is not None:
        raise ops.Rejected("conflict", f"pairing code {code.code} was already approved")
    if code.expires_at <= now:
        raise ops.Rejected("conflict", f"pairing code {code.code} expired already")
    access_store.expire_code(conn, code.code, now)
    _audit(conn, now, op.refused_by, "pairing.refused", code.code, instance=code.instance, sender=code.sender)
    return m.Done()


def revoke_sender(conn, op: m.RevokeSender, now: float) -> m.Done:
    if not access_store.revoke(conn, op.instance, op.sender):
        raise ops.Rejected("not_found", f"{op.sender!r} is not an allowed sender of {op.instance!r}")
    _audit(conn, now, op.revoked_by, "access.revoked", op.sender, instance=op.instance)
    return m.Done()


def daemon_log(conn, op: m.RecordDaemonLog) -> m.Done:
    if len(op.lines) > MAX_LOG_LINES:
        raise ops.Rejected("invalid", f"at most {MAX_LOG_LINES} lines per request, not {len(op.lines)}")
    rows = [(line.at, line.service[:100], line.level[:20], line.event[:200], line.detail[:8000])
            for line in op.lines]
    dashboard_store.add_log_lines(conn, rows, op.before, max(0, op.max_rows))
    return m.Done()
