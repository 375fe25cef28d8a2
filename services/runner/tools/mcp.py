"""MCP servers' tools in the runner: an agent's `mcp = [...]` servers offered as `<server>__<tool>`, each call
under the server's approval rules and run through registry.execute like every tool (so redacted, bounded
into data/tool-output/, and audited by the turn).

Approval, per server and per tool (``[mcp.<name>] approval`` and ``tools``): ``deny`` refuses; ``auto``
runs; ``ask`` answers needs_approval, and the turn asks the person as for the shell (the agent's own
approval mode still applies: its ``auto`` runs it, its ``deny`` refuses). A tool's readOnlyHint makes an
``ask`` tool free only where the operator set ``trust_hints = true``: the hint is the server's word.

One connection per (server, agent): a stdio server runs in that agent's sandbox, with its private folder.
It is started on first use (the first turn that offers the agent its tools), kept for the runner's life,
started again after it dies, not before a backoff that doubles with each death in a row (0.5 s .. 30 s;
a call waits out up to 2 s of it), and stopped with the runner (``close_all``). A server that will not
start is named in the turn's system prompt, and any call of its tools answers why.

The SDK is imported on the first use of a server, not with this module.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from services.runner.llm import ToolSpec
from services.runner.tools.base import Refused, Tool, ToolContext, ToolError, ToolResult

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0
WAIT_OUT_S = 2.0  # a call that finds the server in its backoff waits this much of it, at most
STABLE_S = 60.0  # a server that lived this long died once, not again
SEPARATOR = "__"


@dataclass
class _Slot:
    """One (server, agent): its live connection, the last tools it listed, and its deaths in a row."""

    conn: Any = None  # common.mcp_client.Connection
    tools: list = field(default_factory=list)  # the last listing (offered while the server is down)
    deaths: int = 0
    retry_at: float = 0.0
    error: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


_slots: dict[tuple[str, str], _Slot] = {}


def _backoff(deaths: int) -> float:
    return min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, deaths - 1))


def _failed(slot: _Slot, error: str, lived_s: float | None) -> None:
    slot.deaths = 1 if lived_s is not None and lived_s >= STABLE_S else slot.deaths + 1
    slot.retry_at = time.monotonic() + _backoff(slot.deaths)
    slot.error = error


async def connection(ctx: ToolContext, name: str):
    """The live connection to server ``name`` for ``ctx.agent``, started when there is none; McpUnavailable
    (with the reason) when it is not configured, will not start, or is waiting out its backoff."""
    from common.mcp_client import Connection, McpUnavailable

    server = ctx.cfg.mcp.get(name)
    if server is None:
        raise McpUnavailable(f"agent {ctx.agent!r} lists MCP server {name!r}, which config.toml does not define"
                             f" (add [mcp.{name}])")
    slot = _slots.setdefault((name, ctx.agent), _Slot())
    async with slot.lock:
        conn = slot.conn
        if conn is not None and conn.alive and conn.server == server:
            return conn
        if conn is not None:  # it died, or its config changed (a reload)
            slot.conn = None
            if conn.server == server:
                _failed(slot, conn.why, time.monotonic() - conn.started_at)
                ctx.log.warning("mcp_server_gone", server=name, reason=conn.why, deaths=slot.deaths)
            await conn.close()
        wait = slot.retry_at - time.monotonic()
        if wait > WAIT_OUT_S:
            raise McpUnavailable(f"{slot.error}; it is started again in {wait:.1f}s")
        if wait > 0:
            await asyncio.sleep(wait)
        conn = Connection(name, server, ctx.paths, ctx.cfg, ctx.agent)
        try:
            await conn.open()
        except McpUnavailable as exc:
            _failed(slot, str(exc), None)
            ctx.log.warning("mcp_server_failed", server=name, error=str(exc), deaths=slot.deaths)
            raise
        slot.conn, slot.tools = conn, conn.tools
        ctx.log.info("mcp_server_started", server=name, transport=server.transport, tools=len(conn.tools))
        return conn


async def specs(ctx: ToolContext) -> tuple[list[ToolSpec], list[str]]:
    """(the tool specs of the agent's servers, a line for each server that is unavailable and why)."""
    if not ctx.mcp:
        return [], []
    from common.mcp_client import McpUnavailable

    async def one(name: str) -> tuple[list, str]:
        try:
            return (await connection(ctx, name)).tools, ""
        except McpUnavailable as exc:
            slot = _slots.get((name, ctx.agent))
            return (slot.tools if slot else []), str(exc)

    found = await asyncio.gather(*(one(name) for name in dict.fromkeys(ctx.mcp)))
    tools = [ToolSpec(t.model_name, t.description, t.input_schema) for listed, _ in found for t in listed]
    return tools, [problem for _, problem in found if problem]


def _server_of(ctx: ToolContext, name: str) -> str | None:
    matches = [s for s in ctx.mcp if name.startswith(s + SEPARATOR) and len(name) > len(s) + len(SEPARATOR)]
    return max(matches, key=len) if matches else None


def tool_for(ctx: ToolContext, name: str, raw_args: Any) -> Tool | None:
    """The Tool for a call of ``name`` when it names a tool of one of the agent's servers, else None."""
    server = _server_of(ctx, name)
    if server is None:
        return None
    slot = _slots.get((server, ctx.agent))
    listed = next((t for t in slot.tools if t.model_name == name), None) if slot else None
    spec = ToolSpec(name, listed.description if listed else "", listed.input_schema if listed else {"type": "object"})
    # registry.validate keeps only the schema's top-level properties; a server's schema may allow more
    extra = {k: v for k, v in raw_args.items() if k not in spec.parameters.get("properties", {}) and v is not None} \
        if isinstance(raw_args, dict) and spec.parameters.get("additionalProperties", True) is not False else {}

    async def run(run_ctx: ToolContext, checked: dict[str, Any]) -> ToolResult:
        return await call(run_ctx, server, name, {**extra, **checked})

    return Tool(spec, "mcp", run)


async def call(ctx: ToolContext, server_name: str, name: str, arguments: dict[str, Any]) -> ToolResult:
    """One call: connect (or restart), find the tool, apply the approval rule, call it within timeout_s."""
    from common.mcp_client import McpCallFailed, McpUnavailable, result_text

    try:
        conn = await connection(ctx, server_name)
    except McpUnavailable as exc:
        raise ToolError(str(exc)) from None
    tool = next((t for t in conn.tools if t.model_name == name), None)
    if tool is None:
        names = ", ".join(t.model_name for t in conn.tools) or "none"
        raise ToolError(f"MCP server {server_name!r} has no tool {name!r}; its tools are: {names}")
    server = conn.server
    mode = server.approval_for(tool.name)
    if mode == "deny":
        raise Refused(f"{name} is not allowed here: the operator set approval = \"deny\" for it"
                      f" ([mcp.{server_name}] in config.toml)")
    free = mode == "auto" or (server.trust_hints and tool.read_only)
    if not free and not ctx.approved:
        return ToolResult(f"{name} needs the person's approval; they have been asked. Wait for their answer.",
                          outcome="needs_approval",
                          approval_reason=f"call {name} (a tool of MCP server {server_name})")
    try:
        result = await conn.call(tool.name, arguments)
    except McpCallFailed as exc:
        raise ToolError(str(exc)) from None
    except McpUnavailable as exc:
        raise ToolError(f"{exc}; it is started again at the next call") from None
    text, failed = result_text(result)
    return ToolResult(text, outcome="error" if failed else "ok")


async def close_all(timeout_s: float = 10.0) -> None:
    """Stop every server this runner started (on SIGTERM), within ``timeout_s``."""
    conns = [slot.conn for slot in _slots.values() if slot.conn is not None]
    _slots.clear()
    if conns:
        await asyncio.wait([asyncio.ensure_future(c.close()) for c in conns], timeout=timeout_s)
