"""Starling as an MCP server, driven by the SDK's own client: `starling mcp serve` over stdio and `/mcp` on a running
control service over Streamable HTTP (401 without the control token). Only the six read-only tools exist; they
read what the stores hold (recall by bm25 and per agent, sessions, a session, cron jobs, agents, usage), and no
secret value comes back."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
import urllib.error
import urllib.request

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from common import db
from common.personas import create_pack
from common.secrets import set_secret
from common.stores import audit_store, cron_store, schema_store, session_store, turn_store
from tests.procs import REPO, Proc, make_home, remove_home, start_writer, wait_until

SIX = {"recall_search", "sessions_list", "session_show", "cron_list", "agents_list", "usage"}
SECRET = "sk-live-abcdef0123456789zz"
NOW = time.time()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def home():
    """A home with two agents, their sessions and turns, a cron job, usage rows, and a secret that a turn quotes."""
    home = make_home(f'[control]\nlisten = "127.0.0.1:{_free_port()}"\n'
                     '[providers.default]\nmodel = "fake-model"\napi_key = "openai"\n')
    create_pack(home.paths, "default")
    create_pack(home.paths, "other")
    set_secret(home.paths.secrets_file, "openai", SECRET)
    conn = db.open_writer(home.paths.db_file)
    schema_store.migrate(conn, home.paths.db_file)
    a = session_store.open_session(conn, "default", "tg", "chat-a", NOW - 60)
    b = session_store.open_session(conn, "other", "tg", "chat-b", NOW - 30)
    for session, text in ((a, "the heron nests by the river"), (b, "a heron flew over the mill"),
                          (a, f"my key is {SECRET}, keep it")):
        turn_store.add_user_turn(conn, session, text, "u1", "", "", "", "[]", "{}", NOW - 20)
    turn_store.add_turn(conn, a, "assistant", "Herons nest in colonies.", "{}", NOW - 10)
    cron_store.add(conn, "morning", "0 8 * * *", "Europe/Berlin", None, "say good morning", "default", "tg",
                   "chat-a", "test", NOW)
    audit_store.record_usage(conn, a, 1, "default", "default", "fake-model", 100, 20, 0.5, NOW - 5)
    audit_store.record_usage(conn, b, 2, "other", "default", "fake-model", 10, 2, 0.25, NOW - 5)
    audit_store.record_usage(conn, b, 2, "other", "default", "fake-model", 10, 2, 0.25, NOW - 90 * 86400)
    conn.close()
    home.sessions = (a, b)
    yield home
    remove_home(home)


def _counts(home) -> tuple:
    conn = db.open_reader(home.paths.db_file)
    try:
        with db.read_tx(conn):
            return session_store.count(conn), turn_store.count(conn), len(cron_store.list_all(conn))
    finally:
        conn.close()


async def _exercise(client: Client, sessions: tuple[int, int]) -> dict:
    """Everything a client sees: the tools and one answer of each."""
    listed = (await client.list_tools()).tools

    async def call(name: str, **args):
        result = await client.call_tool(name, args)
        text = " ".join(b.text for b in result.content if b.type == "text")
        return result.is_error, None if result.is_error else json.loads(text), text

    return {
        "tools": {t.name: t for t in listed},
        "all": await call("recall_search", query="heron"),
        "other": await call("recall_search", query="heron", agent="other"),
        "secret": await call("recall_search", query="key keep"),
        "sessions": await call("sessions_list"),
        "sessions_other": await call("sessions_list", agent="other"),
        "show": await call("session_show", session_id=sessions[0]),
        "missing": await call("session_show", session_id=99999),
        "cron": await call("cron_list"),
        "agents": await call("agents_list"),
        "usage": await call("usage", days=30),
        "not_a_tool": await call("session_delete", session_id=sessions[0]),
    }


def _check(seen: dict, sessions: tuple[int, int]) -> None:
    a, b = sessions
    tools = seen["tools"]
    assert SIX == set(tools)
    assert all(t.annotations.read_only_hint and not t.annotations.destructive_hint for t in tools.values())
    _, hits, _ = seen["all"]
    assert {a, b} == {h["session_id"] for h in hits["hits"]}
    assert [b] == [h["session_id"] for h in seen["other"][1]["hits"]]
    err, found, text = seen["secret"]
    assert (False, 1) == (err, len(found["hits"])) and SECRET not in text and "[redacted]" in found["hits"][0]["text"]
    assert [b, a] == [s["id"] for s in seen["sessions"][1]["sessions"]]
    assert [("other", 1)] == [(s["agent"], s["turns"]) for s in seen["sessions_other"][1]["sessions"]]
    err, show, text = seen["show"]
    assert (False, "default", 3) == (err, show["session"]["agent"], len(show["turns"]))
    assert ["user", "user", "assistant"] == [t["role"] for t in show["turns"]] and SECRET not in text
    assert (100, 20, 0.5) == tuple(show["usage"][k] for k in ("input_tokens", "output_tokens", "cost_usd"))
    assert seen["missing"][0] and "no session 99999" in seen["missing"][2]
    [job] = seen["cron"][1]["jobs"]
    assert ("morning", "0 8 * * *", "tg:chat-a", True) == (job["name"], job["schedule"], job["deliver_to"], job["enabled"])
    agents = seen["agents"][1]["agents"]
    assert ["default", "other"] == [x["id"] for x in agents] and "fake-model" == agents[0]["model"]
    assert SECRET not in seen["agents"][2]
    usage = seen["usage"][1]
    assert (0.75, {("default", 1), ("other", 1)}) == (usage["cost_usd"], {(t["agent"], t["calls"]) for t in usage["totals"]})
    assert seen["not_a_tool"][0]


def test_mcp_serve_over_stdio_is_read_only_and_redacted(home):
    before = _counts(home)
    params = StdioServerParameters(command=sys.executable, args=["-m", "common.cli", "--home", str(home.root),
                                                                  "mcp", "serve"], cwd=str(REPO))

    async def go():
        async with Client(stdio_client(params)) as client:
            return await asyncio.wait_for(_exercise(client, home.sessions), 60)

    seen = asyncio.run(go())
    _check(seen, home.sessions)
    assert before == _counts(home)


def _post(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).encode(),
                                     headers={"Content-Type": "application/json",
                                              "Accept": "application/json, text/event-stream",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except urllib.error.URLError:  # not listening yet
        return 0


def test_mcp_on_the_control_service_needs_the_token_and_serves_the_same_tools(home):
    procs = [start_writer(home)]
    try:
        procs.append(Proc(home, "control"))
        url = f"http://{home.cfg.control.listen}/mcp"
        wait_until(lambda: _post(url, None) == 401, timeout=20, what="control to listen")
        token = home.paths.control_token_file.read_text().strip()
        assert (401, 401) == (_post(url, None), _post(url, "x" * 40))

        async def go():
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as http:
                async with Client(streamable_http_client(url, http_client=http)) as client:
                    return await asyncio.wait_for(_exercise(client, home.sessions), 60)

        seen = asyncio.run(go())
        _check(seen, home.sessions)
        assert token not in json.dumps({k: v for k, v in seen.items() if k != "tools"}, default=str)
    finally:
        for proc in reversed(procs):
            proc.stop()
