"""The login and logout, the first-run setup link, and the pages that only look: Overview (services, health,
gateways, disk and WAL, today's figures) and Usage (tokens and cost per day, agent and model, as SVG)."""

from __future__ import annotations

import asyncio
import datetime
import time

from aiohttp import web

from common import dashboard_accounts as accounts
from common import dashboard_setup
from common.errors import InvalidInput, StarlingError
from common.stores import beat_store, dashboard_store, dashboard_views_store as views
from schema import messages as m
from services.control.dashboard import chart
from services.control.dashboard.app import SESSION, Dashboard, FormError, redirect, safe_next

MAX_DAYS = 366
DAY_S = 86400.0
RECENT = 10  # warnings and errors of the last day on the overview


def midnight(now: float) -> float:
    local = datetime.datetime.fromtimestamp(now)
    return local.replace(hour=0, minute=0, second=0, microsecond=0).timestamp()


# ------------------------------------------------------------------ login, logout, setup (no session needed)


def _login_page(d: Dashboard, request: web.Request, status: int = 200, error: str = "", name: str = "") -> web.Response:
    token, new = d.auth.login_token(request)
    with d.deps.read() as conn:
        none_yet = dashboard_store.account_count(conn) == 0
    response = d.render(request, "login.html", status=status, csrf=token, error=error, name=name,
                        next=safe_next(request.query.get("next", "/")), none_yet=none_yet)
    if new:
        d.auth.remember_login_token(response, token)
    return response


async def login_form(d: Dashboard, request: web.Request) -> web.StreamResponse:
    try:
        return _login_page(d, request)
    except Exception as exc:  # noqa: BLE001 - no database yet
        return d.failure(request, exc, "The database cannot be read right now.")


async def login(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    expected = request.cookies.get("starling_login", "")
    if not d.auth.same_origin(request) or not d.auth.csrf_ok(str(form.get("csrf", "")), expected):
        return _login_page(d, request, 403, "This form is out of date; try again.")
    name = str(form.get("name", ""))[:200]
    try:
        token, why = await d.auth.login(request, name, str(form.get("password", ""))[:2048])
    except (asyncio.TimeoutError, StarlingError):
        return _login_page(d, request, 503, "Starling's writer did not answer, so no session could be opened;"
                                            " try again shortly.")
    if token is None:
        try:  # the name is shown again only when it is a valid account name (not a password in the wrong field)
            shown = accounts.check_username(name)
        except InvalidInput:
            shown = ""
        return _login_page(d, request, 429 if "Too many" in why else 401, why, shown)
    response = redirect(safe_next(str(form.get("next", "/"))))
    d.auth.start_session(response, token)
    return response


async def logout(d: Dashboard, request: web.Request) -> web.StreamResponse:
    return await d.auth.logout(request, request[SESSION])


async def setup_form(d: Dashboard, request: web.Request) -> web.StreamResponse:
    token = request.query.get("token", "")
    if not dashboard_setup.valid(d.deps.paths, token):
        return d.plain(request, 404, "This setup link is not valid (used already, or never made here). Add an"
                                     " account with `starling dashboard user add NAME`.")
    return d.render(request, "setup.html", token=token, name="")


async def setup(d: Dashboard, request: web.Request) -> web.StreamResponse:
    form = await request.post()
    token = str(form.get("token", ""))
    if not dashboard_setup.valid(d.deps.paths, token):
        return d.plain(request, 404, "This setup link is not valid (used already, or never made here).")
    try:
        name = accounts.check_username(str(form.get("name", "")))
        password = str(form.get("password", ""))
        if password != str(form.get("again", "")):
            raise InvalidInput("the two passwords differ")
        accounts.check_password(password, name)
        hashed = await asyncio.to_thread(accounts.hash_password, password)
        await d.write(m.DashboardAccount(action="add", username=name, password_hash=hashed, role="admin",
                                         by="dashboard:setup-link", first=True), f"account {name!r}")
    except (InvalidInput, FormError) as exc:
        shown = str(form.get("name", "")) if isinstance(exc, FormError) else ""
        return d.render(request, "setup.html", status=400, token=token, name=shown, error=str(exc))
    dashboard_setup.used(d.deps.paths)
    return redirect("/login")


# ------------------------------------------------------------------ overview


async def overview(d: Dashboard, request: web.Request) -> web.StreamResponse:
    now = time.time()
    report = await d.deps.report()
    try:
        processes = await d.deps.processes()
    except StarlingError:
        processes = []
    with d.deps.read() as conn:
        today = views.today(conn, midnight(now), now)
        restarts = {b.service: max(0, b.starts - 1) for b in beat_store.all_beats(conn)}
        recent = dashboard_store.log_lines(conn, now - DAY_S, ("warning", "error", "critical"), "", RECENT)
    services = report["checks"]["services"]["services"]
    running = {p.get("name"): p for p in processes}
    gateways = {name: svc for name, svc in services.items() if name.startswith("gateway")}
    return d.render(request, "overview.html", report=report, services=services, running=running,
                    gateways=gateways, today=today, restarts=restarts,
                    recent=recent)


# ------------------------------------------------------------------ usage


def _days(text: str) -> int:
    try:
        days = int(text)
    except ValueError:
        raise InvalidInput(f"days must be a whole number, not {text!r}") from None
    if not 1 <= days <= MAX_DAYS:
        raise InvalidInput(f"days must be 1 to {MAX_DAYS}, not {days}")
    return days


async def usage(d: Dashboard, request: web.Request) -> web.StreamResponse:
    try:
        days = _days(request.query.get("days", "30"))
    except InvalidInput as exc:
        return d.plain(request, 400, str(exc))
    now = time.time()
    start = midnight(now) - (days - 1) * 86400
    with d.deps.read() as conn:
        rows = views.usage_by_day(conn, start)
    labels = [(datetime.date.fromtimestamp(start) + datetime.timedelta(days=i)).isoformat() for i in range(days)]
    index = {label: i for i, label in enumerate(labels)}
    tokens = {"input": [0.0] * days, "output": [0.0] * days}
    cost: dict[str, list[float]] = {}
    by_agent: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        i = index.get(r.day)
        if i is None:
            continue
        tokens["input"][i] += r.input_tokens
        tokens["output"][i] += r.output_tokens
        cost.setdefault(r.agent, [0.0] * days)[i] += r.cost_usd
        total = by_agent.setdefault((r.agent, r.model), [0, 0, 0, 0.0])
        total[0] += r.calls
        total[1] += r.input_tokens
        total[2] += r.output_tokens
        total[3] += r.cost_usd
    return d.render(
        request, "usage.html", days=days,
        tokens_chart=chart.stacked_bars(labels, tokens, title=f"tokens per day, last {days} days"),
        cost_chart=chart.stacked_bars(labels, cost or {"cost": [0.0] * days}, unit="$",
                                      title=f"cost per day and agent, last {days} days"),
        totals=sorted(by_agent.items()), grand=[sum(v[k] for v in by_agent.values()) for k in range(4)])


ROUTES = [
    ("GET", "/", overview, "view"),
    ("GET", "/usage", usage, "view"),
    ("POST", "/logout", logout, "session"),
]
PUBLIC = [
    ("GET", "/login", login_form),
    ("POST", "/login", login),
    ("GET", "/setup", setup_form),
    ("POST", "/setup", setup),
]
