"""Connections to the MCP servers of config.toml (`[mcp.<name>]`), made with the official SDK's Client.

A stdio server is started here, under the kernel sandbox like the shell (common/sandbox: Landlock,
namespaces, rlimits, a clean environment, its own process group, no network unless the operator set
``network = true``), and the SDK gets its pipes as a transport: the SDK's own stdio_client spawns
unconfined. A Streamable HTTP server is reached with the configured headers. Either way one connection
is owned by one task (the SDK's context managers must be entered and left in the same task); calls may
come from any task. The handshake and the first listing are bounded by ``start_timeout_s``, each call by
``timeout_s``. Tools are named for the model ``<server>__<tool>``, shortened and made unique to fit
^[a-zA-Z0-9_-]{1,64}$.

Shared by the runner's tool adapter (services/runner/tools/mcp.py) and `starling doctor`. The SDK is
slow to import (about a second): import this module only where a server is used.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import re
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import mcp_types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from common import sandbox
from common.config import Config, McpServer
from common.errors import StarlingError
from common.home import Paths
from common.redact import redact
from common.secrets import resolve_secret

CLIENT_INFO = mcp_types.Implementation(name="starling", version="1")
NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_NAME = 64
MAX_DESCRIPTION = 2000
MAX_MESSAGE = 32 * 1024 * 1024  # one JSON-RPC line from a stdio server; a longer one ends the connection
STDERR_TAIL = 2000  # bytes of a stdio server's stderr kept for the error that names why it stopped
MAX_PAGES = 50  # of a tool listing
STOP_GRACE_S = 1.0  # after stdin closes, before SIGTERM; as long again before SIGKILL
_CLOSED = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)


class McpUnavailable(StarlingError):
    """The server could not be started or reached, or it went away; the message says why (for the model,
    the operator and doctor)."""


class McpCallFailed(StarlingError):
    """One call failed (a timeout, a protocol error) while the server stays usable."""


@dataclass(frozen=True)
class ListedTool:
    name: str  # the server's
    model_name: str  # <server>__<tool>, as the model sees and calls it
    description: str
    input_schema: dict
    read_only: bool  # the server's readOnlyHint


def model_name(server: str, tool: str, taken: set[str]) -> str:
    """``<server>__<tool>`` within ^[a-zA-Z0-9_-]{1,64}$: other characters become ``_``; a name that had to
    change, was too long or is taken gets a short hash of the tool's real name so it stays unique."""
    clean = re.sub(r"[^a-zA-Z0-9_-]", "_", tool) or "_"
    name = f"{server}__{clean}"
    if clean == tool and len(name) <= MAX_NAME and name not in taken:
        return name
    digest = hashlib.sha256(tool.encode()).hexdigest()
    for n in range(100):
        suffix = f"_{digest[:6]}" + (f"{n}" if n else "")
        candidate = name[: MAX_NAME - len(suffix)] + suffix
        if candidate not in taken:
            return candidate
    raise McpUnavailable(f"MCP server {server!r}: cannot name tool {tool!r} uniquely")


def listed_tools(server: str, tools: list[mcp_types.Tool]) -> list[ListedTool]:
    out: list[ListedTool] = []
    taken: set[str] = set()
    for tool in tools:
        name = model_name(server, tool.name, taken)
        taken.add(name)
        schema = clean_schema(tool.input_schema)
        hints = tool.annotations
        text = (tool.description or tool.title or tool.name).strip()
        out.append(ListedTool(tool.name, name, f"[MCP server {server}] {text}"[:MAX_DESCRIPTION], schema,
                              bool(hints and hints.read_only_hint)))
    return out


def clean_schema(schema: Any) -> dict:
    """A server's input schema as the runner's argument checks and the model APIs take it: an object schema
    whose properties are each a schema object and whose ``required`` names strings (a server's odd schema
    must not break a turn)."""
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema["type"] = "object"
    props = schema.get("properties")
    schema["properties"] = {str(k): (v if isinstance(v, dict) else {}) for k, v in props.items()} \
        if isinstance(props, dict) else {}
    required = schema.get("required")
    schema["required"] = [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    return schema


def result_text(result: mcp_types.CallToolResult) -> tuple[str, bool]:
    """(what the model reads, whether the tool said it failed) of one call's result."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        elif isinstance(block, (mcp_types.ImageContent, mcp_types.AudioContent)):
            size = len(block.data) * 3 // 4
            parts.append(f"[{block.type} ({block.mime_type}, about {size} bytes): not shown]")
        elif isinstance(block, mcp_types.ResourceLink):
            parts.append(f"[resource link: {block.uri}" + (f" ({block.name})" if block.name else "") + "]")
        elif isinstance(block, mcp_types.EmbeddedResource):
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if text is not None else f"[binary resource {res.uri} ({res.mime_type or '?'})]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts) if parts else "(the tool returned nothing)", bool(result.is_error)


# ------------------------------------------------------------------ the confined stdio transport


@dataclass(frozen=True)
class Launch:
    """How a stdio server is started: argv, folder, whole environment, and the confinement."""

    argv: list[str]
    cwd: str
    env: dict[str, str]
    found: sandbox.Sandbox
    policy: sandbox.Policy


def server_env(paths: Paths, home: str, extra: dict[str, str]) -> dict[str, str]:
    """A clean environment: PATH (absolute entries outside the workspace), HOME and TMPDIR in the agent's
    private folder, LANG, TERM=dumb, and the server's configured variables; nothing else of the runner's."""
    workspace = os.path.realpath(paths.workspace_dir)
    entries = [e for e in os.environ.get("PATH", os.defpath).split(os.pathsep)
               if e.startswith("/") and not (os.path.realpath(e) + "/").startswith(workspace + "/")]
    tmp = os.path.join(home, ".tmp")
    os.makedirs(tmp, mode=0o700, exist_ok=True)
    env = {"PATH": os.pathsep.join(entries) or os.defpath, "HOME": home, "TMPDIR": tmp,
           "LANG": os.environ.get("LANG", "C.UTF-8") or "C.UTF-8", "TERM": "dumb"}
    env.update(extra)
    return env


def launch_for(paths: Paths, cfg: Config, name: str, server: McpServer, agent: str) -> Launch:
    """The confined launch of stdio server ``name`` for ``agent``: its private folder is cwd and HOME and
    writable, as for the shell. McpUnavailable when this host cannot confine and sandbox is not "none",
    or a secret of ``env`` is missing."""
    found = sandbox.probe(cfg.tools.sandbox)
    if not found.usable:
        raise McpUnavailable(f"MCP server {name!r} is off: this host cannot confine programs"
                             f" ({found.reason or 'no Landlock'}); stdio MCP servers, like the shell, need"
                             " [tools] sandbox = \"none\" to run unconfined")
    home = paths.private_workspace(agent)
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    values = {var: resolve_secret(secret, paths.secrets_file, key=f"mcp.{name}.env.{var}")
              for var, secret in server.env.items()}
    shell = cfg.tools.shell
    policy = sandbox.policy_for(paths, agent, sandbox.limits_for(shell, job=True), network=server.network,
                                extra_read=tuple(shell.read_paths))
    return Launch([server.command, *server.args], str(home), server_env(paths, str(home), values), found, policy)


class ConfinedStdio:
    """A transport for the SDK's Client: starts the server under the sandbox, bridges its pipes to the
    SDK's message streams, and stops it (stdin closed, then SIGTERM, then SIGKILL of its process group and
    of every process left in its user namespace)."""

    def __init__(self, launch: Launch) -> None:
        self.launch = launch
        self.proc: asyncio.subprocess.Process | None = None
        self.exited = asyncio.Event()  # its stdout ended: the server exited or closed it
        self.stderr = bytearray()
        self.namespace = ""
        self._tasks: list[asyncio.Task] = []

    def why(self) -> str:
        """Why the server stopped (exit status, the tail of its stderr), redacted."""
        code = self.proc.returncode if self.proc is not None else None
        status = ("exited" if code is None else f"exited with status {code}" if code >= 0
                  else f"was killed by signal {-code}")
        tail = self.stderr.decode("utf-8", "replace").strip()
        return redact(status + (f"; its stderr ends: {tail[-500:]}" if tail else ""))

    async def __aenter__(self):
        launch = self.launch
        try:
            self.proc = await sandbox.spawn(launch.found, launch.policy, launch.argv, cwd=launch.cwd, env=launch.env,
                                            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                            stderr=asyncio.subprocess.PIPE)
        except OSError as exc:
            raise McpUnavailable(f"cannot start {launch.argv[0]!r}: {exc.strerror or exc}") from None
        self.namespace = sandbox.namespace_of(self.proc.pid)
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](16)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](16)
        self._tasks = [asyncio.create_task(self._read(read_send)), asyncio.create_task(self._write(write_recv)),
                       asyncio.create_task(self._drain_stderr())]
        return read_recv, write_send

    async def __aexit__(self, *exc_info) -> None:
        await asyncio.shield(self.stop())

    async def _read(self, send) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        pending: list[bytes] = []
        size = 0
        try:
            async with send:
                while chunk := await self.proc.stdout.read(65536):
                    *lines, rest = chunk.split(b"\n")
                    if lines:
                        lines[0] = b"".join(pending) + lines[0]
                        pending, size = [], 0
                        for line in lines:
                            if line.strip():
                                await send.send(_parse(line))
                    if rest:
                        pending.append(rest)
                        size += len(rest)
                        if size > MAX_MESSAGE:
                            self.stderr += b"\n[a message larger than the limit: the connection was ended]"
                            return
        except _CLOSED:
            pass
        finally:
            self.exited.set()

    async def _write(self, recv) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            async with recv:
                async for message in recv:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    self.proc.stdin.write(data.encode() + b"\n")
                    await self.proc.stdin.drain()
        except (*_CLOSED, ConnectionError, OSError):
            pass

    async def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        with contextlib.suppress(OSError):
            while chunk := await self.proc.stderr.read(65536):
                self.stderr += chunk
                del self.stderr[:-STDERR_TAIL]

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                proc.stdin.close()
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
            if await _exited(proc, STOP_GRACE_S):
                break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it left behind in its group
        await asyncio.to_thread(sandbox.kill_namespace, self.namespace)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.exited.set()


def _parse(line: bytes) -> SessionMessage | Exception:
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # the SDK hands it to the session's message handler and reads on
        return exc


async def _exited(proc: asyncio.subprocess.Process, within: float) -> bool:
    deadline = time.monotonic() + within
    while proc.returncode is None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.01)
    return True


# ------------------------------------------------------------------ one connection


@dataclass
class Connection:
    """One live connection to a server, owned by a task of its own until ``close`` or until the server goes.

    ``open`` starts it (McpUnavailable on failure, with the reason); ``tools`` is its listing; ``call``
    runs one tool. After the server went (``alive`` false) ``why`` says why; a new Connection replaces it.
    """

    name: str
    server: McpServer
    paths: Paths
    cfg: Config
    agent: str
    tools: list[ListedTool] = field(default_factory=list)
    why: str = ""
    started_at: float = 0.0
    _client: Any = None
    _stdio: ConfinedStdio | None = None
    _task: asyncio.Task | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _gone: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def alive(self) -> bool:
        return self._client is not None and not self._gone.is_set() and not self._stop.is_set()

    async def open(self) -> None:
        self.started_at = time.monotonic()
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._own(ready), name=f"mcp-{self.name}-{self.agent}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.server.start_timeout_s)
        except asyncio.TimeoutError:
            await self.close()
            detail = f" ({self._stdio.why()})" if self._stdio is not None and self._stdio.exited.is_set() else ""
            raise McpUnavailable(f"MCP server {self.name!r} did not answer the handshake within"
                                 f" {self.server.start_timeout_s:g}s{detail}") from None
        except BaseException:
            await self.close()
            raise

    async def _own(self, ready: asyncio.Future) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                transport = await self._transport(stack)
                client = await stack.enter_async_context(
                    Client(transport, client_info=CLIENT_INFO, cache=None, read_timeout_seconds=None))
                self.tools = listed_tools(self.name, await _list_all(client))
                self._client = client
                ready.set_result(None)
                await self._until_stopped_or_gone()
        except Exception as exc:  # noqa: BLE001 - any failure of the SDK or the transport is the server's state
            reason = self._explain(exc)
            if not ready.done():
                ready.set_exception(McpUnavailable(reason))
            elif not self.why:
                self.why = reason
        finally:
            self._gone.set()
            if not ready.done():
                ready.set_exception(McpUnavailable(f"MCP server {self.name!r} stopped while starting"))
            if not self.why:
                self.why = (f"MCP server {self.name!r} " + self._stdio.why() if self._stdio is not None
                            else f"the connection to MCP server {self.name!r} ended")

    async def _until_stopped_or_gone(self) -> None:
        waits = [asyncio.ensure_future(self._stop.wait())]
        if self._stdio is not None:
            waits.append(asyncio.ensure_future(self._stdio.exited.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self._stdio is not None and self._stdio.exited.is_set() and not self._stop.is_set():
            await _exited(self._stdio.proc, 0.5)
            self.why = f"MCP server {self.name!r} {self._stdio.why()}"

    async def _transport(self, stack: contextlib.AsyncExitStack):
        if self.server.transport == "stdio":
            launch = launch_for(self.paths, self.cfg, self.name, self.server, self.agent)
            self._stdio = ConfinedStdio(launch)
            return self._stdio
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        headers = {header: resolve_secret(secret, self.paths.secrets_file, key=f"mcp.{self.name}.headers.{header}")
                   for header, secret in self.server.headers.items()}
        timeout = httpx2.Timeout(min(30.0, self.server.start_timeout_s), read=max(self.server.timeout_s, 30.0) + 5)
        http = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=timeout))
        return streamable_http_client(self.server.url, http_client=http)

    def _explain(self, exc: BaseException) -> str:
        if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            return self._explain(exc.exceptions[0])
        if isinstance(exc, StarlingError):
            text = str(exc)
        elif isinstance(exc, MCPError):
            text = f"MCP error {exc.code}: {exc.message}"
        else:
            text = f"{type(exc).__name__}: {exc}"
        where = self.server.url if self.server.transport == "http" else self.server.command
        if self._stdio is not None and self._stdio.exited.is_set():
            text += f"; the server {self._stdio.why()}"
        return redact(f"MCP server {self.name!r} ({where}) could not be used: {text}")

    async def call(self, tool: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """One tools/call, bounded by ``timeout_s``. McpCallFailed for a timeout or an error answer;
        McpUnavailable when the server went away (this connection is then dead)."""
        if not self.alive:
            raise McpUnavailable(self.why or f"MCP server {self.name!r} is not connected")
        timeout = self.server.timeout_s
        try:
            return await asyncio.wait_for(self._client.call_tool(tool, arguments, read_timeout_seconds=timeout),
                                          timeout + 2)
        except asyncio.TimeoutError:
            raise McpCallFailed(f"{self.name}: {tool} did not answer within {timeout:g}s (timeout_s); the call"
                                " was cancelled") from None
        except MCPError as exc:
            if exc.code == mcp_types.REQUEST_TIMEOUT:
                raise McpCallFailed(f"{self.name}: {tool} did not answer within {timeout:g}s (timeout_s); the"
                                    " call was cancelled") from None
            if exc.code == mcp_types.CONNECTION_CLOSED:
                await self._wait_gone()
                raise McpUnavailable(self.why or f"the connection to MCP server {self.name!r} closed") from None
            raise McpCallFailed(redact(f"{self.name}: {tool}: MCP error {exc.code}: {exc.message}")) from None
        except (StarlingError, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - a transport failure (HTTP, a broken pipe): reconnect next time
            self.why = redact(f"MCP server {self.name!r}: {type(exc).__name__}: {exc}")
            self._stop.set()
            raise McpUnavailable(self.why) from None

    async def _wait_gone(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._gone.wait(), 2.0)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 4 * STOP_GRACE_S + 2)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - stopping must not fail
                self._task.cancel()
        if self._stdio is not None:
            await self._stdio.stop()
        self._gone.set()


async def _list_all(client: Client) -> list[mcp_types.Tool]:
    tools: list[mcp_types.Tool] = []
    cursor = None
    for _ in range(MAX_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


async def check(paths: Paths, cfg: Config, name: str, agent: str) -> tuple[bool, str]:
    """Start server ``name`` as ``agent`` would, list its tools and stop it: (ok, a line saying what)."""
    server = cfg.mcp[name]
    conn = Connection(name, server, paths, cfg, agent)
    try:
        await conn.open()
    except StarlingError as exc:
        return False, str(exc)
    try:
        shown = ", ".join(t.model_name for t in conn.tools[:8]) + (" …" if len(conn.tools) > 8 else "")
        where = "confined stdio" if server.transport == "stdio" else server.url
        return True, f"{len(conn.tools)} tools ({where}, as agent {agent}): {shown or 'none'}"
    finally:
        await conn.close()
