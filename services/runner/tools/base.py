"""What every tool gets and returns: the context of the turn it runs in, and its result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

from common.config import Config
from common.home import Paths
from schema import messages as m
from services.runner.llm import ToolSpec

# Sends one write to the writer and returns its result (raises common.errors.WriteRejected/BusTimeout).
WriterCall = Callable[[m.WriteOp], Awaitable[m.Result | None]]


@dataclass
class ToolContext:
    """Where a tool runs: one agent, one session, one turn; how it reaches the writer and the database."""

    paths: Paths
    cfg: Config
    agent: str
    session_id: int
    turn_id: int
    instance: str
    chat: str
    call: WriterCall  # writes go through the writer, like every other process's
    reader: Callable[[], Any]  # returns a read-only apsw connection (use common.db.read_tx around reads)
    log: Any  # structlog logger bound with session_id and turn_id
    approved: bool = False  # the call may run despite its class: the person approved it, a grant, or mode auto
    auto_approved: bool = False  # ... and it was mode auto, not a person: never a reason to lift confinement
    worker: str = ""  # the runner holding this turn's lease (writes that need the lease carry it)
    mcp: tuple[str, ...] = ()  # the [mcp.<name>] servers this agent may use (its config's ``mcp``)


@dataclass
class ToolResult:
    """``content`` goes back to the model. ``outcome``: ok | error | refused | needs_approval."""

    content: str
    outcome: str = "ok"
    approval_reason: str = ""  # with needs_approval: what the person is asked to allow
    files: list[Path] = field(default_factory=list)  # files sent to the chat by the tool, if any
    result_path: str = ""  # set by registry.execute when the full content was too large and went to a file


class ToolError(Exception):
    """A tool failed in a way the model can act on; the message is for the model (outcome "error")."""


class Refused(ToolError):
    """A tool will not do this, approved or not; the message is for the model (outcome "refused")."""


ToolRun = Callable[[ToolContext, dict[str, Any]], Awaitable[ToolResult]]


@dataclass(frozen=True)
class Tool:
    """One tool: what the model sees (``spec``), the config group that enables it, and its coroutine.

    ``inline_limit``: results larger than this many bytes go to data/tool-output/ (output.py).
    ``offered``: whether the config lets the model see it at all (web_search needs a provider); None: always.
    """

    spec: ToolSpec
    group: str  # files | shell | memory | recall | send | cron | jobs | web | skills (an agent config's ``tools``)
    run: ToolRun
    inline_limit: int = 16 * 1024
    offered: Callable[[Config], bool] | None = None
