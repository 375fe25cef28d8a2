"""MCP client: servers written with the SDK (tests/mcp_servers.py), over confined stdio and Streamable HTTP, used
through the runner's tool path (registry.execute): listed as <server>__<tool>, called, asked, approved, denied,
timed out, crashed and restarted; a stdio server is confined (no secrets.json, no network unless configured);
config errors; and one call end to end through a real runner and the fake model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.config import McpServer, load_config, referenced_secrets
from common.errors import ConfigError
from common.mcp_client import model_name
from common.secrets import set_secret
from common.db import read_tx
from common.stores import audit_store, session_store
from services.runner.tools import mcp, registry
from tests.procs import REPO, make_home, remove_home, wait_until
from tests.tool_helpers import make_ctx, no_secrets_from_other_tests  # noqa: F401 - an autouse fixture

SERVER = str(REPO / "tests" / "mcp_servers.py")
TOKEN = "mcp-header-value-0123456789"
GH_TOKEN = "ghp-test-value-abcdef-987654"


def stdio_config(extra: str = "", name: str = "t") -> str:
    return (f'[tools.shell]\nread_paths = ["{REPO / "tests"}"]\n'
            f'[mcp.{name}]\ncommand = "{sys.executable}"\nargs = ["{SERVER}", "stdio"]\n' + extra)


@contextlib.contextmanager
def home_with(config: str):
    home = make_home(config)
    try:
        yield home
    finally:
        remove_home(home)


def run(coro):
    """Run a test's steps in one loop, and stop every server it started before the loop ends."""
    async def go():
        try:
            return await coro
        finally:
            await mcp.close_all()
    return asyncio.run(go())


def ctx_for(home, servers=("t",), **kw):
    ctx = make_ctx(home, **kw)
    ctx.mcp = tuple(servers)
    return ctx


async def call(ctx, tool, **args):
    return await registry.execute(ctx, tool, args, ["files"])


# ------------------------------------------------------------------ names and config


def test_model_names_fit_the_pattern_and_stay_unique():
    taken: set[str] = set()
    names = [model_name("gh", tool, taken) or "" for tool in ("search", "search.code", "search_code")]
    for n in names:
        taken.add(n)
    long = model_name("gh", "x" * 100, taken)
    assert ("gh__search", True) == (names[0], all(len(n) <= 64 for n in names + [long]))
    assert names[1] != names[2] and names[1].startswith("gh__search_code_") and names[2] == "gh__search_code"
    assert len(long) == 64 and long != model_name("gh", "x" * 99, set())


def test_config_names_the_key_that_is_wrong(tmp_path):
    def error(text: str) -> str:
        (tmp_path / "config.toml").write_text(text)
        with pytest.raises(ConfigError) as exc:
            load_config(tmp_path / "config.toml")
        return str(exc.value)

    assert "mcp.a.command" in error('[mcp.a]\ncommand = "x"\nurl = "http://127.0.0.1:1/mcp"\n')
    assert "mcp.a.headers" in error('[mcp.a]\ncommand = "x"\nheaders = { A = "b" }\n')
    assert "mcp.a.url" in error('[mcp.a]\nurl = "ftp://h/x"\n')
    assert "mcp.a.approval" in error('[mcp.a]\ncommand = "x"\napproval = "maybe"\n')
    (tmp_path / "config.toml").write_text('[mcp.a]\ncommand = "x"\nenv = { GITHUB_TOKEN = "gh-token" }\n'
                                          '[mcp.b]\nurl = "https://h/mcp"\nheaders = { Authorization = "b-auth" }\n')
    found = referenced_secrets(load_config(tmp_path / "config.toml"))
    assert {"gh-token": "mcp.a.env.GITHUB_TOKEN", "b-auth": "mcp.b.headers.Authorization"}.items() <= found.items()


def test_approval_rules_per_server_and_tool():
    server = McpServer(command="x", approval="deny", tools={"search": "auto"})
    assert ("auto", "deny") == (server.approval_for("search"), server.approval_for("delete"))


# ------------------------------------------------------------------ stdio


def test_stdio_tools_are_listed_with_their_schemas_and_called():
    with home_with(stdio_config('approval = "auto"\n')) as home:
        async def go():
            ctx = ctx_for(home)
            specs, problems = await registry.mcp_specs(ctx)
            result = await call(ctx, "t__add", a=2, b="3")
            return {s.name: s for s in specs}, problems, result
        specs, problems, result = run(go())
    assert ([], {"t__echo", "t__add", "t__slow", "t__crash", "t__read_file"}) == (problems, set(specs) & {
        "t__echo", "t__add", "t__slow", "t__crash", "t__read_file"})
    assert {"a", "b"} == set(specs["t__add"].parameters["properties"]) == set(specs["t__add"].parameters["required"])
    assert specs["t__add"].description.startswith("[MCP server t] Add two integers")
    assert ("ok", "5") == (result.outcome, result.content)


def test_ask_needs_approval_approved_runs_deny_refuses_and_hints_count_only_when_trusted():
    config = stdio_config('approval = "ask"\ntools = { note = "deny", add = "auto" }\n')
    with home_with(config) as home:
        async def go():
            ctx = ctx_for(home)
            await registry.mcp_specs(ctx)
            asked = await call(ctx, "t__echo", text="hi")
            auto = await call(ctx, "t__add", a=1, b=1)
            denied = await call(ctx, "t__note", text="x")
            ctx.approved = True
            approved = await call(ctx, "t__echo", text="hi")
            still_denied = await call(ctx, "t__note", text="x")
            return asked, auto, denied, approved, still_denied
        asked, auto, denied, approved, still_denied = run(go())
    assert ("needs_approval", "call t__echo (a tool of MCP server t)") == (asked.outcome, asked.approval_reason)
    assert ("ok", "2") == (auto.outcome, auto.content)
    assert ("refused", "refused") == (denied.outcome, still_denied.outcome)
    assert "deny" in denied.content and ("ok", "echo: hi") == (approved.outcome, approved.content)

    with home_with(stdio_config('trust_hints = true\n')) as home:
        async def hinted():
            ctx = ctx_for(home)
            await registry.mcp_specs(ctx)
            return await call(ctx, "t__echo", text="free"), await call(ctx, "t__note", text="x")
        read_only, writes = run(hinted())
    assert ("ok", "needs_approval") == (read_only.outcome, writes.outcome)


def test_a_call_that_takes_too_long_times_out_and_the_server_goes_on():
    with home_with(stdio_config('approval = "auto"\ntimeout_s = 0.5\n')) as home:
        async def go():
            ctx = ctx_for(home)
            await registry.mcp_specs(ctx)
            started = time.monotonic()
            slow = await call(ctx, "t__slow", seconds=5)
            took = time.monotonic() - started
            return slow, took, await call(ctx, "t__echo", text="still here")
        slow, took, after = run(go())
    assert ("error", True) == (slow.outcome, "did not answer within 0.5s" in slow.content)
    assert took < 3 and ("ok", "echo: still here") == (after.outcome, after.content)


def test_a_crashed_server_is_an_error_then_started_again():
    with home_with(stdio_config('approval = "auto"\n')) as home:
        async def go():
            ctx = ctx_for(home)
            await registry.mcp_specs(ctx)
            first = (await call(ctx, "t__pid")).content
            crashed = await call(ctx, "t__crash")
            again = await call(ctx, "t__pid")  # waits out the first backoff (0.5 s), then starts it
            return first, crashed, again
        first, crashed, again = run(go())
    assert ("error", True) == (crashed.outcome, "exited with status 3" in crashed.content)
    assert "started again" in crashed.content
    assert "ok" == again.outcome and again.content.isdigit() and again.content != first


def test_a_server_that_will_not_start_is_named_to_the_model_and_backs_off(monkeypatch):
    monkeypatch.setattr(mcp, "WAIT_OUT_S", 0.0)  # a call does not wait out the backoff: it says when
    config = '[mcp.broken]\ncommand = "/bin/false"\n[mcp.nothere]\ncommand = "/no/such/program"\n'
    with home_with(config) as home:
        async def go():
            ctx = ctx_for(home, servers=("broken", "nothere", "undefined"))
            specs, problems = await registry.mcp_specs(ctx)
            waiting = await call(ctx, "broken__x")
            await asyncio.sleep(mcp.BACKOFF_FIRST_S)
            tried_again = await call(ctx, "broken__x")
            return specs, problems, waiting, tried_again, await call(ctx, "broken__x")
        specs, problems, waiting, tried_again, longer = run(go())
    text = "\n".join(problems)
    assert ([], 3) == (specs, len(problems))
    assert "'broken'" in text and "exited with status 1" in text
    assert "/no/such/program" in text and "config.toml does not define" in text
    assert ["error"] * 3 == [r.outcome for r in (waiting, tried_again, longer)]
    assert waiting.content.endswith("started again in 0.5s") and "exited with status 1" in tried_again.content
    assert longer.content.endswith("started again in 1.0s")


def test_a_stdio_server_is_confined_like_the_shell():
    set_extra = f'approval = "auto"\nenv = {{ GITHUB_TOKEN = "gh" }}\n'
    with home_with(stdio_config(set_extra)) as home:
        set_secret(home.paths.secrets_file, "gh", GH_TOKEN)
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        try:
            async def go():
                ctx = ctx_for(home)
                await registry.mcp_specs(ctx)
                own = ctx.paths.private_workspace(ctx.agent) / "mine.txt"
                own.write_text("my own file")
                (ctx.paths.private_workspace("bob") / "x").write_text("bob's")
                return [await call(ctx, "t__read_file", path=str(home.paths.secrets_file)),
                        await call(ctx, "t__read_file", path=str(own)),
                        await call(ctx, "t__read_file", path=str(ctx.paths.private_workspace("bob") / "x")),
                        await call(ctx, "t__env", name="GITHUB_TOKEN"),
                        await call(ctx, "t__env", name="STARLING_HOME"),
                        await call(ctx, "t__connect", port=port)]
            secrets, own, other, token, starling, network = [r.content for r in run(go())]
        finally:
            listener.close()
    assert secrets.startswith("cannot read") and other.startswith("cannot read") and "my own file" == own
    assert ("[redacted]", "<unset>") == (token, starling)  # it got the value; the model never sees it
    assert network.startswith("refused")


def test_network_for_a_stdio_server_is_the_operators_decision():
    with home_with(stdio_config('approval = "auto"\nnetwork = true\n')) as home:
        listener = socket.create_server(("127.0.0.1", 0))
        try:
            async def go():
                ctx = ctx_for(home)
                await registry.mcp_specs(ctx)
                return await call(ctx, "t__connect", port=listener.getsockname()[1])
            assert "connected" == run(go()).content
        finally:
            listener.close()


def test_a_big_result_goes_to_tool_output():
    with home_with(stdio_config('approval = "auto"\n')) as home:
        async def go():
            ctx = ctx_for(home)
            await registry.mcp_specs(ctx)
            return await call(ctx, "t__big", size=200_000)
        result = run(go())
        saved = Path(result.result_path)
        assert (True, 200_000) == (saved.parent.parent == home.paths.tool_output_dir, saved.stat().st_size)
    assert "too large to show in full" in result.content and "line 000000" in result.content


def test_close_all_stops_the_server_processes():
    with home_with(stdio_config('approval = "auto"\n')) as home:
        async def go():
            ctx = ctx_for(home)
            await registry.mcp_specs(ctx)
            pid = int((await call(ctx, "t__pid")).content)
            await mcp.close_all()
            return pid
        pid = asyncio.run(go())
    wait_until(lambda: not _alive(pid), timeout=5, what="the server to be gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return False


# ------------------------------------------------------------------ Streamable HTTP


class HttpServer:
    def __init__(self, folder: Path, port: int = 0) -> None:
        self.port_file = folder / f"mcp-port-{time.monotonic_ns()}"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.mcp_servers", "http", "--port-file",
                                      str(self.port_file), "--header", f"X-Token={TOKEN}", "--port", str(port)],
                                     cwd=REPO)
        wait_until(self.port_file.exists, timeout=20, what="the MCP HTTP server to listen")
        self.port = int(self.port_file.read_text())

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def http_config(port: int, header: str = 'headers = { X-Token = "mcp-token" }\n') -> str:
    return f'[mcp.h]\nurl = "http://127.0.0.1:{port}/mcp"\n{header}approval = "auto"\ntimeout_s = 1\n'


def test_http_server_listed_called_timed_out_and_reconnected_after_it_restarts(tmp_path):
    folder = tmp_path
    server = HttpServer(folder)
    try:
        with home_with(http_config(server.port)) as home:
            set_secret(home.paths.secrets_file, "mcp-token", TOKEN)

            async def go():
                ctx = ctx_for(home, servers=("h",))
                specs, problems = await registry.mcp_specs(ctx)
                echo = await call(ctx, "h__echo", text="over http")
                slow = await call(ctx, "h__slow", seconds=5)
                server.stop()
                gone = await call(ctx, "h__echo", text="x")
                restarted = HttpServer(folder, server.port)
                try:
                    await asyncio.sleep(mcp.BACKOFF_FIRST_S)
                    back = await call(ctx, "h__echo", text="back")
                finally:
                    restarted.stop()
                return {s.name for s in specs}, problems, echo, slow, gone, back
            names, problems, echo, slow, gone, back = run(go())
    finally:
        server.proc.kill()
    assert ([], True) == (problems, {"h__echo", "h__slow"} <= names)
    assert ("ok", "echo: over http") == (echo.outcome, echo.content)
    assert ("error", True) == (slow.outcome, "did not answer within 1s" in slow.content)
    assert "error" == gone.outcome and ("ok", "echo: back") == (back.outcome, back.content)


def test_http_server_without_its_header_is_unavailable_with_the_reason(tmp_path):
    server = HttpServer(tmp_path)
    try:
        with home_with(http_config(server.port, header="")) as home:
            async def go():
                ctx = ctx_for(home, servers=("h",))
                return await registry.mcp_specs(ctx), await call(ctx, "h__echo", text="x")
            (specs, problems), result = run(go())
    finally:
        server.stop()
    assert ([], 1) == (specs, len(problems))
    assert "'h'" in problems[0] and "error" == result.outcome and TOKEN not in result.content


# ------------------------------------------------------------------ through a real runner


def test_a_call_end_to_end_through_the_runner_asks_then_runs_and_is_audited():
    """...and a server that will not start is named to the model in the system prompt."""
    from tests.runner_stack import converse, own_home, reader, started, texts, tool_results
    from tests.procs import Proc, start_writer
    from tests.test_runner_tools import approval_id

    def edit(text: str) -> str:
        return text + stdio_config('timeout_s = 10\n') + '[mcp.broken]\ncommand = "/bin/false"\n'

    with own_home(edit) as home:
        settings = home.paths.agents_dir / "default" / "config.toml"
        settings.write_text(settings.read_text().replace("mcp = []", 'mcp = ["t", "broken"]'))
        started(home, start_writer(home))
        runner = started(home, Proc(home, "runner"))
        home.fake.add({"tool_call": {"name": "t__echo", "arguments": {"text": "through the runner"}}},
                      {"text": "The server said it."})
        _, [notice] = converse(home, "mcp", "use the echo tool")
        assert "t__echo" in notice
        _, replies = converse(home, "mcp", f"/approve {approval_id(notice)}", replies=2)
        bodies = [r["body"] for r in home.fake.requests("openai")]
        offered = {t["function"]["name"] for t in bodies[0]["tools"]}
        results = [content for _, content in tool_results(bodies[-1])]
        conn = reader(home)
        try:
            with read_tx(conn):
                rows = [r for s in session_store.recent(conn) for r in audit_store.tools_for_session(conn, s.id)]
        finally:
            conn.close()
        pid_before = _server_pids(runner.pid)
        runner.stop()
        assert "The server said it." == replies[-1]
        assert "t__echo" in offered and ["echo: through the runner"] == results
        system = texts(bodies[0])[0]
        assert "# Unavailable tools" in system and "MCP server 'broken'" in system and "exited with status 1" in system
        assert not any(name.startswith("broken__") for name in offered)
        assert [("t__echo", "ok")] == [(r.tool, r.outcome) for r in rows if r.outcome != "pending"]
        assert json.loads(rows[-1].arguments) == {"text": "through the runner"}
        assert pid_before, "the runner started the MCP server"
        wait_until(lambda: not any(_alive(p) for p in pid_before), timeout=10, what="the server to stop with the runner")


def _server_pids(runner_pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if any(part.endswith(b"mcp_servers.py") for part in cmd):
                    stat = Path(f"/proc/{entry}/stat").read_text().split(") ")[1].split()
                    if int(stat[1]) == runner_pid:
                        out.append(int(entry))
    return out


def test_doctor_starts_each_server_and_names_the_ones_that_fail():
    from common.cli import doctor_cmd
    from common.personas import create_pack

    config = stdio_config() + '[mcp.broken]\ncommand = "/bin/false"\n'
    with home_with(config) as home:
        create_pack(home.paths, "default")
        settings = home.paths.agents_dir / "default" / "config.toml"
        settings.write_text(settings.read_text().replace("mcp = []", 'mcp = ["t", "broken", "ghost"]'))
        found = {c.reason.split(":")[0]: c for c in doctor_cmd.run_checks(home.root) if c.name == "mcp"}
    assert ("ok", "fail") == (found["t"].status, found["broken"].status)
    assert "11 tools (confined stdio, as agent default): t__echo" in found["t"].reason
    assert "exited with status 1" in found["broken"].reason
    [ghost] = [c for c in found.values() if "'ghost'" in c.reason]
    assert "fail" == ghost.status and "does not define" in ghost.reason


def test_an_odd_schema_from_a_server_cannot_break_the_argument_checks():
    from common.mcp_client import clean_schema

    odd = {"type": "array", "properties": {"a": True, "b": {"type": "integer"}}, "required": ["b", 3]}
    assert {"type": "object", "properties": {"a": {}, "b": {"type": "integer"}}, "required": ["b"]} == clean_schema(odd)
    assert {"type": "object", "properties": {}, "required": []} == clean_schema(None)
