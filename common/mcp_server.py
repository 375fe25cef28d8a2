"""Starling as an MCP server, read-only: ``recall_search``, ``sessions_list``, ``session_show``, ``cron_list``,
``agents_list`` and ``usage``, built with the SDK's MCPServer over the stores.

Served on stdio by `starling mcp serve` (common/cli/mcp_cmd.py) and over Streamable HTTP at ``/mcp`` on the
control service, behind the control token (services/control/mcp_http.py). Every tool reads through a
read-only connection (``mode=ro``, common/db.py) in one short read transaction; none writes, and no tool
exists that could. Every text returned is redacted of each secret value Starling knows, and the agents'
settings are shown without any secret (names of providers and servers only). Every tool carries the
readOnlyHint. The SDK is slow to import: import this module only to serve.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from common import db, personas
from common.config import Config
from common.errors import StarlingError
from common.home import Paths
from common.redact import redact_value
from common.stores import audit_store, cron_store, recall_store, session_store, turn_store

TOOLS = ("recall_search", "sessions_list", "session_show", "cron_list", "agents_list", "usage")
READ_ONLY = ToolAnnotations(readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False)
MAX_LIMIT = 200
TURN_CHARS = 4000  # of one turn's text in session_show
SNIPPET_CHARS = 300  # of a hit's text in recall_search
_LAST = 2**62

INSTRUCTIONS = ("Read-only access to a Starling home: search what agents and people said (recall_search), list"
                " and read conversations (sessions_list, session_show), scheduled jobs (cron_list), the agents"
                " (agents_list) and model usage and cost (usage). Nothing here changes anything.")


def _when(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds") if ts else None


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… [{len(text) - limit} more characters]"


def _limit(value: int) -> int:
    if value < 1:
        raise ToolError("limit must be 1 or more")
    return min(value, MAX_LIMIT)


class Reads:
    """The six reads, each in one short read transaction on a read-only connection of its own."""

    def __init__(self, paths: Paths, cfg: Config) -> None:
        self.paths = paths
        self.cfg = cfg

    def _read(self, fn, *args) -> Any:
        try:
            conn = db.open_reader(self.paths.db_file)
        except StarlingError as exc:
            raise ToolError(str(exc)) from None
        try:
            with db.read_tx(conn):
                return fn(conn, *args)
        finally:
            conn.close()

    def recall_search(self, query: str, agent: str = "", limit: int = 10) -> dict:
        if not recall_store.quote_query(query):
            raise ToolError("the query has no words to search for")
        hits = self._read(recall_store.search, query, _limit(limit), agent or None)
        return {"query": query, "agent": agent or None, "hits": [
            {"turn_id": h.turn_id, "session_id": h.session_id, "role": h.role, "at": _when(h.created_at),
             "rank": round(h.rank, 4), "text": _cut(h.content, SNIPPET_CHARS)} for h in hits]}

    def sessions_list(self, agent: str = "", limit: int = 20) -> dict:
        if agent:
            found = self._read(session_store.recent_for_agent_with_turns, agent, _limit(limit))
        else:
            found = self._read(session_store.recent_with_turns, _limit(limit))
        return {"sessions": [_session(s) | {"turns": n} for s, n in found]}

    def session_show(self, session_id: int, limit: int = 50) -> dict:
        def read(conn):
            session = session_store.get(conn, session_id)
            if session is None:
                return None
            turns = turn_store.history(conn, session_id, _LAST, _limit(limit))
            return session, turns, audit_store.usage_for_session(conn, session_id)

        found = self._read(read)
        if found is None:
            raise ToolError(f"no session {session_id}; sessions_list shows which there are")
        session, turns, (tokens_in, tokens_out, cost) = found
        return {"session": _session(session) | {"summary": session.summary or None},
                "usage": {"input_tokens": tokens_in, "output_tokens": tokens_out, "cost_usd": round(cost, 6)},
                "turns": [{"id": t.id, "role": t.role, "at": _when(t.created_at), "state": t.state,
                           "text": _cut(t.content, TURN_CHARS)} for t in turns]}

    def cron_list(self, agent: str = "") -> dict:
        def read(conn):
            jobs = cron_store.list_for_agent(conn, agent) if agent else cron_store.list_all(conn)
            return [(job, cron_store.last_run_of(conn, job.id)) for job in jobs]

        return {"jobs": [{
            "name": job.name, "agent": job.agent, "schedule": job.schedule or None, "tz": job.tz,
            "run_at": _when(job.run_at), "enabled": bool(job.enabled), "prompt": job.prompt,
            "deliver_to": f"{job.deliver_instance}:{job.deliver_chat}", "disabled_reason": job.disabled_reason or None,
            "last_run": {"state": last[0], "scheduled_for": _when(last[1])} if last else None,
        } for job, last in self._read(read)]}

    def agents_list(self) -> dict:
        out = []
        for pack in personas.list_packs(self.paths):
            entry: dict[str, Any] = {"id": pack.id, "skills": pack.skills, "missing_files": pack.missing}
            try:
                settings = personas.load_settings(pack.path)
            except StarlingError as exc:
                entry["error"] = str(exc)
            else:
                provider = self.cfg.providers.get(settings.provider)
                entry.update(provider=settings.provider, model=settings.model or (provider.model if provider else None),
                             tools=settings.tools, mcp=settings.mcp, approval=settings.approval.mode)
            out.append(entry)
        return {"agents": out}

    def usage(self, agent: str = "", days: float = 30) -> dict:
        if not 0 < days <= 3650:
            raise ToolError("days must be more than 0 and at most 3650")
        rows = self._read(audit_store.usage_totals, time.time() - days * 86400, agent)
        return {"days": days, "agent": agent or None, "totals": [
            {"agent": r.agent, "provider": r.provider, "model": r.model, "calls": r.calls,
             "input_tokens": r.input_tokens, "output_tokens": r.output_tokens, "cost_usd": round(r.cost_usd, 6)}
            for r in rows],
            "cost_usd": round(sum(r.cost_usd for r in rows), 6)}


def _session(s: session_store.Session) -> dict:
    return {"id": s.id, "agent": s.agent, "instance": s.instance, "chat": s.chat, "title": s.title or None,
            "state": s.state, "created": _when(s.created_at), "last_active": _when(s.last_active_at),
            "closed": _when(s.closed_at)}


def build(paths: Paths, cfg: Config) -> MCPServer:
    """The read-only server over ``paths``' database; every answer redacted."""
    reads = Reads(paths, cfg)
    server = MCPServer("starling", instructions=INSTRUCTIONS, log_level="WARNING")

    def tool(description: str):
        def register(fn):
            server.add_tool(fn, name=fn.__name__, description=description, annotations=READ_ONLY)
            return fn
        return register

    @tool("Full-text search (FTS5, ranked by bm25, stemmed) over every turn; `agent` keeps one agent's"
          " sessions. Every word must match. Returns the best hits first with their session ids.")
    def recall_search(query: str, agent: str = "", limit: int = 10) -> dict:
        return redact_value(reads.recall_search(query, agent, limit))

    @tool("The most recently active conversations (sessions), newest first, with their number of turns;"
          " `agent` keeps one agent's.")
    def sessions_list(agent: str = "", limit: int = 20) -> dict:
        return redact_value(reads.sessions_list(agent, limit))

    @tool("One conversation: its header, usage and cost, and its last `limit` turns, oldest first.")
    def session_show(session_id: int, limit: int = 50) -> dict:
        return redact_value(reads.session_show(session_id, limit))

    @tool("The scheduled (cron) jobs: schedule, time zone, prompt, where they deliver, enabled or why not, and"
          " their last run; `agent` keeps one agent's.")
    def cron_list(agent: str = "") -> dict:
        return redact_value(reads.cron_list(agent))

    @tool("The agents: their provider and model, tool groups, MCP servers, approval mode and skills.")
    def agents_list() -> dict:
        return redact_value(reads.agents_list())

    @tool("Model calls, tokens and cost over the last `days` days, per agent, provider and model; `agent`"
          " keeps one agent's.")
    def usage(agent: str = "", days: float = 30) -> dict:
        return redact_value(reads.usage(agent, days))

    return server
