"""The dashboard's frame: what a page handler gets (reads, writes through the writer, rendering, the
session), the guard every page passes (no session, no page; a POST needs the CSRF token and the admin
role), and the promise that a page never shows a stack trace: an error is logged and a plain page says so."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import apsw
from aiohttp import web

from common import db
from common.config import Config
from common.errors import StarlingError, WriteRejected
from common.home import Paths
from common.stores import dashboard_store
from schema import messages as m
from services.control.dashboard import fmt
from services.control.dashboard.auth import Auth

if TYPE_CHECKING:
    import jinja2

HERE = Path(__file__).resolve().parent
# the request's session (auth.py), under a typed key where aiohttp has them
SESSION = web.RequestKey("session", object) if hasattr(web, "RequestKey") else "session"
WRITE_TIMEOUT_S = 15.0
NOT_ANSWERED = "Starling's writer did not answer, so nothing was changed; the Overview page shows its state."

Handler = Callable[["Dashboard", web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Deps:
    """What the dashboard uses of the control service."""

    paths: Paths
    config: Callable[[], Config]  # read at use: a reload applies
    log: Any
    client: Any  # a bus.WriterClient (``call``)
    report: Callable[[], Awaitable[dict]]  # the health report of /health
    processes: Callable[[], Awaitable[list[dict]]]  # supervisord's view, [] without one

    def __post_init__(self) -> None:
        self._reader = None

    @contextlib.contextmanager
    def read(self):
        """A short read transaction on the control service's own read-only connection."""
        if self._reader is None:
            self._reader = db.open_reader(self.paths.db_file)
        try:
            with db.read_tx(self._reader):
                yield self._reader
        except apsw.Error:
            self._reader.close()
            self._reader = None  # opened again next time: a replaced or damaged file must not stick
            raise

    async def call(self, op: m.WriteOp) -> m.Result | None:
        return await asyncio.wait_for(self.client.call(op), WRITE_TIMEOUT_S)


class FormError(Exception):
    """What is wrong with a form, shown above it (HTTP 400); the CLI's words wherever the CLI has them."""


class Dashboard:
    def __init__(self, deps: Deps) -> None:
        self.deps = deps
        self.log = deps.log
        self.auth = Auth(deps)
        self.flashes: dict[str, tuple[str, str]] = {}  # session token hash -> (kind, text), shown once
        self.streams: set[asyncio.Task] = set()  # open log streams (views_logs.py), ended by close()
        self.closing = asyncio.Event()
        self.links: dict[str, Any] = {}  # instance -> the `starling whatsapp link` process started from here

    async def close(self) -> None:
        """The control service stops: log streams end now (not at aiohttp's shutdown timeout), and a
        linking started from here is stopped."""
        self.closing.set()
        for proc in self.links.values():
            if proc.returncode is None:
                proc.terminate()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(proc.wait(), 5)
        if self.streams:
            await asyncio.wait(set(self.streams), timeout=2)

    # ------------------------------------------------------------ rendering

    @functools.cached_property
    def env(self) -> jinja2.Environment:
        """The templates, loaded at the first page: Jinja2 costs the control service ~2.4 MB of RSS from start."""
        import jinja2

        env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                                 undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
        fmt.install(env)
        return env

    def render(self, request: web.Request, template: str, status: int = 200, **context) -> web.Response:
        session = request.get(SESSION)
        flash = self.flashes.pop(session.token_hash, None) if session is not None else None
        page = self.env.get_template(template).render(
            session=session, csrf=session.csrf if session else context.pop("csrf", ""), flash=flash,
            now=time.time(), path=request.path, admin=session is not None and session.role == "admin",
            error=context.pop("error", ""), **context)
        return web.Response(text=page, status=status, content_type="text/html", headers=_NO_STORE)

    def done(self, request: web.Request, where: str, text: str) -> web.Response:
        """After a change: back to the page (a reload does not repeat it), with ``text`` shown once."""
        self.flashes[request[SESSION].token_hash] = ("ok", text)
        if len(self.flashes) > 1000:
            self.flashes.pop(next(iter(self.flashes)))
        return redirect(where)

    # ------------------------------------------------------------ writes

    async def write(self, op: m.WriteOp, what: str) -> m.Result | None:
        """One write through the writer; FormError with the writer's reason (as the CLI words it)."""
        try:
            return await self.deps.call(op)
        except WriteRejected as exc:
            if exc.writer_condition:
                raise FormError(f"{what}: the writer cannot store it now ({exc.code}); try again shortly") from None
            raise FormError(f"{what}: {str(exc).split(': ', 1)[-1]}") from None
        except (asyncio.TimeoutError, StarlingError):
            raise FormError(NOT_ANSWERED) from None

    async def audit(self, request: web.Request, action: str, target: str = "", **detail) -> None:
        """The audit row of a change made from here, with the account's name (never a secret value)."""
        op = m.DashboardAudit(account=request[SESSION].username, action=action, target=target,
                              detail=json.dumps(detail, sort_keys=True, default=str))
        try:
            await self.deps.call(op)
        except (asyncio.TimeoutError, StarlingError) as exc:
            self.log.warning("dashboard_audit_failed", action=action, error=str(exc) or type(exc).__name__)

    # ------------------------------------------------------------ the guard

    def guarded(self, handler: Handler, kind: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """``kind``: view (a session), session (a POST of any account: logout) or change (a POST of an admin)."""

        async def guard(request: web.Request) -> web.StreamResponse:
            try:
                session = self.auth.session_of(request)
            except Exception as exc:  # noqa: BLE001 - no database yet, or it cannot be read
                return self.failure(request, exc, "The database cannot be read right now.")
            if session is None:
                if request.method == "GET":
                    return redirect("/login?next=" + _quote_next(request.path_qs))
                return self.plain(request, 403, "Your session has ended; log in again.")
            request[SESSION] = session
            if kind != "view":
                form = await request.post()
                if not self.auth.same_origin(request) or not self.auth.csrf_ok(str(form.get("csrf", "")),
                                                                              session.csrf):
                    return self.plain(request, 403, "This form is out of date (its security token does not match);"
                                                    " reload the page and try again.")
                if kind == "change" and session.role != "admin":
                    return self.plain(request, 403, f"Your account ({session.username}) is a viewer: it may look"
                                                    " at every page but change nothing.")
            try:
                return await handler(self, request)
            except web.HTTPException:
                raise
            except Exception as exc:  # noqa: BLE001 - never a stack trace in a page
                return self.failure(request, exc)

        return guard

    def failure(self, request: web.Request, exc: BaseException, text: str = "") -> web.Response:
        ref = secrets.token_hex(4)
        self.log.error("dashboard_page_failed", path=request.path, ref=ref, kind=type(exc).__name__,
                       error=str(exc)[:500])
        return self.plain(request, 500, (text or "This page could not be shown.")
                          + f" The control service's log has the details (ref {ref}).")

    def plain(self, request: web.Request, status: int, text: str) -> web.Response:
        return self.render(request, "message.html", status=status, message=text)


_NO_STORE = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
             "Referrer-Policy": "same-origin",
             "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self';"
                                        " script-src 'self'; frame-ancestors 'none'; form-action 'self'"}


def _quote_next(path: str) -> str:
    from urllib.parse import quote

    return quote(path, safe="")


def safe_next(value: str) -> str:
    """Where a login goes next: a path of this site only (never another host)."""
    return value if value.startswith("/") and not value.startswith("//") and "\\" not in value else "/"


def redirect(where: str) -> web.Response:
    """303 See Other: after a POST, the browser GETs ``where`` (a reload does not post again)."""
    return web.Response(status=303, headers={"Location": where, "Cache-Control": "no-store"})
