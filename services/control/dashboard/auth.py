"""Who is looking: dashboard logins, session cookies, CSRF tokens and roles, and the login rate limits.

- A session is a random token in an HttpOnly, SameSite=Strict cookie (Secure, as ``__Host-starling``, when
  ``[control] public_url`` is https); the database keeps its SHA-256 only, with the CSRF token of its forms
  and its expiry (SESSION_S). Logout, a new password, a new role or the account's removal end it.
- Every POST needs the session's CSRF token in its form (the login form a token of its own cookie), and an
  Origin, when the browser sends one, of this host.
- Login: per address, ADDRESS_FAILURES failed logins in ADDRESS_WINDOW_S and the address waits (429); per
  account, LOCK_AFTER failures in a row lock it for LOCK_S (kept in the database, so a restart does not
  lift it). Every login, failure and refusal is an audit row; a name that is no account is not kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections import deque
from urllib.parse import urlsplit

from aiohttp import web

from common import dashboard_accounts as accounts
from common.errors import InvalidInput
from common.stores import dashboard_store
from schema import messages as m

SESSION_S = 12 * 3600
LOCK_AFTER = 5
LOCK_S = 15 * 60
ADDRESS_FAILURES = 20
ADDRESS_WINDOW_S = 15 * 60
MAX_ADDRESSES = 10_000  # addresses remembered at once (a flood from many forgets the oldest)
LOGIN_COOKIE = "starling_login"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Limiter:
    """Failed logins per address in a sliding window, in memory (the control service is one process)."""

    def __init__(self, limit: int = ADDRESS_FAILURES, window_s: float = ADDRESS_WINDOW_S) -> None:
        self.limit, self.window_s = limit, window_s
        self.failures: dict[str, deque] = {}

    def _recent(self, address: str, now: float) -> deque:
        times = self.failures.get(address)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        return times

    def wait_s(self, address: str, now: float) -> float:
        """How long this address must wait before it may try again (0: it may now)."""
        times = self._recent(address, now)
        return times[0] + self.window_s - now if len(times) >= self.limit else 0.0

    def failed(self, address: str, now: float) -> None:
        if address not in self.failures and len(self.failures) >= MAX_ADDRESSES:
            self.failures.pop(next(iter(self.failures)))
        self.failures.setdefault(address, deque()).append(now)


def minutes(seconds: float) -> str:
    whole = max(1, round(seconds / 60))
    return f"{whole} minute{'s' if whole != 1 else ''}"


class Auth:
    def __init__(self, deps) -> None:
        self.deps = deps
        self.limiter = Limiter()

    # ------------------------------------------------------------ cookies

    @property
    def secure(self) -> bool:
        return self.deps.config().control.public_url.startswith("https://")

    @property
    def cookie(self) -> str:
        return "__Host-starling" if self.secure else "starling_session"

    def _set_cookie(self, response: web.StreamResponse, name: str, value: str, max_age: int) -> None:
        response.set_cookie(name, value, max_age=max_age, path="/", httponly=True, samesite="Strict",
                            secure=self.secure)

    def session_of(self, request: web.Request) -> dashboard_store.Session | None:
        token = request.cookies.get(self.cookie, "")
        if not token or len(token) > 200:
            return None
        with self.deps.read() as conn:
            return dashboard_store.session(conn, token_hash(token), time.time())

    def same_origin(self, request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        if origin is None:  # an older browser, or curl: the CSRF token alone decides
            return True
        public = self.deps.config().control.public_url
        allowed = {request.host} | ({urlsplit(public).netloc} if public else set())
        return urlsplit(origin).netloc in allowed

    @staticmethod
    def csrf_ok(given: str, expected: str) -> bool:
        return bool(given) and bool(expected) and hmac.compare_digest(given.encode(), expected.encode())

    # ------------------------------------------------------------ login

    def address(self, request: web.Request) -> str:
        return request.remote or "?"

    def login_token(self, request: web.Request) -> tuple[str, bool]:
        """The login form's CSRF token: the one in its cookie, or a new one (True: set the cookie)."""
        given = request.cookies.get(LOGIN_COOKIE, "")
        if 20 <= len(given) <= 100:
            return given, False
        return secrets.token_urlsafe(24), True

    def remember_login_token(self, response: web.StreamResponse, token: str) -> None:
        self._set_cookie(response, LOGIN_COOKIE, token, 3600)

    async def login(self, request: web.Request, username: str, password: str) -> tuple[str | None, str]:
        """(session token, "") for a good login; (None, why) otherwise: the text shown on the form."""
        now = time.time()
        address = self.address(request)
        wait = self.limiter.wait_s(address, now)
        if wait:
            await self._failed(username, address, "address rate-limited", known=False)
            return None, f"Too many failed logins from this address; try again in {minutes(wait)}."
        try:
            name = accounts.check_username(username)
        except InvalidInput:
            name = ""
        with self.deps.read() as conn:
            found = dashboard_store.account(conn, name) if name else None
        if found is not None and found.locked_until > now:
            await self._failed(name, address, "account locked")
            return None, (f"This account is locked after {LOCK_AFTER} failed logins; try again in"
                          f" {minutes(found.locked_until - now)}, or set a new password with"
                          f" `starling dashboard user passwd {name}`.")
        stored = found.password_hash if found is not None else accounts.dummy_hash()
        good = await asyncio.to_thread(accounts.verify_password, stored, password)
        if not (good and found is not None):
            self.limiter.failed(address, now)
            recorded = await self._failed(name if found is not None else "", address, "wrong name or password",
                                          known=found is not None)
            if recorded is not None and recorded.locked_until:
                return None, (f"Wrong name or password. The account is now locked for {minutes(LOCK_S)}"
                              f" after {LOCK_AFTER} failed logins in a row.")
            return None, "Wrong name or password."
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
        await self.deps.call(m.DashboardLogin(username=found.username, address=address, ok=True,
                                              token_hash=token_hash(token), csrf=csrf, expires_at=now + SESSION_S))
        return token, ""

    async def _failed(self, name: str, address: str, reason: str, known: bool = True) -> m.LoginRecorded | None:
        op = m.DashboardLogin(username=name if known else "", address=address, ok=False, reason=reason,
                              lock_after=LOCK_AFTER, lock_s=LOCK_S)
        try:
            return await self.deps.call(op)
        except Exception as exc:  # noqa: BLE001 - the writer away: the refusal stands, the audit row is missed
            self.deps.log.warning("dashboard_login_audit_failed", error=str(exc) or type(exc).__name__)
            return None

    def start_session(self, response: web.StreamResponse, token: str) -> None:
        self._set_cookie(response, self.cookie, token, SESSION_S)
        response.del_cookie(LOGIN_COOKIE, path="/")

    async def logout(self, request: web.Request, session: dashboard_store.Session) -> web.StreamResponse:
        await self.deps.call(m.DashboardLogout(token_hash=session.token_hash, by=session.username))
        response = web.Response(status=303, headers={"Location": "/login"})
        response.del_cookie(self.cookie, path="/")
        return response
