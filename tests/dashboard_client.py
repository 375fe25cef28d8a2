"""Dashboard test helpers: the dashboard's app on aiohttp's test server against a real writer and a real
SQLite file, accounts made through the writer, and a logged-in client that fills in each form's CSRF token."""

from __future__ import annotations

import contextlib
import re
import time

import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from common import dashboard_accounts as accounts
from common import health
from schema import messages as m
from services.control.dashboard import Deps, install

PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


async def add_account(home, name: str, role: str = "admin", password: str = PASSWORD) -> None:
    async with home.client("accounts") as c:
        await c.call(m.DashboardAccount(action="add", username=name, password_hash=accounts.hash_password(password),
                                        role=role, by="test"))


@contextlib.asynccontextmanager
async def dashboard(home, cfg=None):
    """A TestClient of the dashboard app (the control service's routes without the rest)."""
    cfg = cfg or home.cfg
    async with home.client("control") as writer:
        async def report() -> dict:
            return health.evaluate(home.paths, cfg, [], time.time())

        async def processes() -> list[dict]:
            return []

        app = web.Application()
        deps = Deps(home.paths, lambda: cfg, structlog.get_logger(), writer, report, processes)
        board = install(app, deps)
        client = TestClient(TestServer(app))
        await client.start_server()
        client.board = board
        try:
            yield client
        finally:
            await board.close()
            await client.close()


def csrf_of(text: str) -> str:
    found = _CSRF.search(text)
    assert found, "no CSRF token in the page"
    return found[1]


async def login(client, name: str, password: str = PASSWORD):
    page = await client.get("/login")
    token = csrf_of(await page.text())
    return await client.post("/login", data={"csrf": token, "name": name, "password": password, "next": "/"},
                             allow_redirects=False)


async def post(client, path: str, data: dict, page: str = "/"):
    """A form sent as the browser sends it: with the CSRF token of the page it is on."""
    token = csrf_of(await (await client.get(page)).text())
    return await client.post(path, data={"csrf": token, **data}, allow_redirects=False)
