"""The shell tool: one command line in the agent's private workspace, classed (classify.py), bounded, clean env.

The command runs with ``bash -c`` in its own session (process group) with cwd and $HOME the agent's
private workspace, stdin closed, stdout and stderr merged, and an environment of PATH (absolute entries
outside the workspace only), HOME, LANG, TERM=dumb and a few pager and git settings: no STARLING_*, no
keys or tokens. On timeout, and whenever the command returns, its whole process group is killed
(background work belongs in job_start).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from services.runner.llm import ToolSpec
from services.runner.tools import confine
from services.runner.tools.base import Refused, Tool, ToolContext, ToolResult
from services.runner.tools.classify import ASK, READ, REFUSE, SCRATCH, classify

__all__ = ["classify", "READ", "ASK", "REFUSE", "SCRATCH", "TOOLS", "command_env", "gate"]

DEFAULT_TIMEOUT_S = 60
MAX_TIMEOUT_S = 600
MAX_CAPTURE = 1024 * 1024  # bytes kept from the output; the rest is counted and dropped
EXIT_GRACE_S = 0.5  # after the command exits, how long its stragglers may keep the pipe open
TERM_GRACE_S = 1.0  # between SIGTERM and SIGKILL of a timed-out group

# git status/log/diff/show run free, and git config can name programs to run. The file tools refuse to
# write inside .git/ (confine.py); here no global or system config is read (the agent could write
# ~/.gitconfig: $HOME is its workspace), bare repositories are not discovered, and the settings that run
# programs on reads and can be overridden without breaking git are (command-line config wins over a
# repository's). Residual: a repository config written by an approved command (diff.external, textconv
# drivers) runs on a later free `git diff`.
_GIT_OVERRIDES = [
    ("core.fsmonitor", "false"), ("core.pager", "cat"), ("log.showSignature", "false"),
    ("safe.bareRepository", "explicit"), ("protocol.ext.allow", "never"),
]
_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_CONFIG_COUNT": str(len(_GIT_OVERRIDES)),
    **{f"GIT_CONFIG_KEY_{i}": key for i, (key, _) in enumerate(_GIT_OVERRIDES)},
    **{f"GIT_CONFIG_VALUE_{i}": value for i, (_, value) in enumerate(_GIT_OVERRIDES)},
}


def _bash() -> str:
    return shutil.which("bash") or "/bin/sh"


def command_env(ctx: ToolContext, home: Path) -> dict[str, str]:
    """The whole environment of an agent's command: nothing inherited but PATH, LANG (and nothing secret)."""
    workspace = os.path.realpath(ctx.paths.workspace_dir)
    entries = []
    for entry in os.environ.get("PATH", os.defpath).split(os.pathsep):
        real = os.path.realpath(entry) if entry else ""
        if entry.startswith("/") and not (real == workspace or real.startswith(workspace + os.sep)):
            entries.append(entry)
    env = {
        "PATH": os.pathsep.join(entries) or os.defpath,
        "HOME": str(home),
        "LANG": os.environ.get("LANG", "C.UTF-8") or "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
    }
    env.update(_GIT_ENV)
    return env


def gate(ctx: ToolContext, command: str, what: str = "run") -> ToolResult | None:
    """None when the command may run now; else the refused or needs_approval result."""
    level, reason = classify(command, ctx)
    if level == REFUSE:
        raise Refused(f"{reason}. This command is never run, even with approval.")
    if level == ASK and not ctx.approved:
        return ToolResult(
            f"This command needs the person's approval ({reason}); they have been asked. Wait for their answer.",
            outcome="needs_approval", approval_reason=f"{what} `{command}` ({reason})")
    return None


def _kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _read_capped(stream: asyncio.StreamReader, keep: bytearray) -> int:
    """Read a stream to its end, keeping the first MAX_CAPTURE bytes; returns the total size."""
    total = 0
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return total
        total += len(chunk)
        room = MAX_CAPTURE - len(keep)
        if room > 0:
            keep += chunk[:room]


async def run_command(ctx: ToolContext, command: str, timeout_s: float) -> tuple[int | None, bytes, int]:
    """(exit code or None on timeout, captured output, total output size) of one command.

    The output pipe is ours, not asyncio's subprocess pipe: the exit is seen when the command exits even
    if something it started in the background (or in a session of its own) still holds the pipe.
    """
    home = confine.private_dir(ctx)
    rfd, wfd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            _bash(), "-c", command, cwd=home, env=command_env(ctx, home), stdin=asyncio.subprocess.DEVNULL,
            stdout=wfd, stderr=wfd, start_new_session=True)
    except BaseException:
        os.close(rfd)
        raise
    finally:
        os.close(wfd)
    loop = asyncio.get_running_loop()
    stream = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stream),
                                                os.fdopen(rfd, "rb", buffering=0))
    keep = bytearray()
    reader = asyncio.ensure_future(_read_capped(stream, keep))
    code: int | None = None
    try:
        try:
            code = await asyncio.wait_for(proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            _kill_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), TERM_GRACE_S)
            except asyncio.TimeoutError:
                pass
        _kill_group(proc.pid)  # stragglers (`cmd &`) and a group that ignored SIGTERM
        await proc.wait()
        try:
            total = await asyncio.wait_for(asyncio.shield(reader), EXIT_GRACE_S)
        except asyncio.TimeoutError:
            total = len(keep)  # a process in a session of its own still holds the pipe: stop reading
    finally:
        _kill_group(proc.pid)
        reader.cancel()
        transport.close()
    return code, bytes(keep), total


async def shell(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    command = args["command"]
    if not command.strip():
        return ToolResult("the command is empty", outcome="error")
    timeout_s = args.get("timeout_s", DEFAULT_TIMEOUT_S)
    stop = gate(ctx, command)
    if stop is not None:
        return stop
    code, out, total = await run_command(ctx, command, timeout_s)
    text = out.decode("utf-8", "replace")
    if total > len(out):
        text += f"\n[output cut at {len(out)} of {total} bytes]"
    if code is None:
        return ToolResult(f"[timed out after {timeout_s}s: the command and its process group were stopped]\n{text}",
                          outcome="error")
    status = f"[exit code {code}]" if code >= 0 else f"[killed by signal {-code}]"
    return ToolResult(f"{status}\n{text}" if text else status, outcome="ok" if code == 0 else "error")


TOOLS = [
    Tool(ToolSpec(
        "shell",
        "Run a bash command line in your private workspace (cwd and $HOME; its .scratchpad/ is for scratch"
        " files). Read-only commands (ls, cat, grep, find, git status/log/diff/show, …) run at once;"
        " anything that writes, deletes, installs, uses the network or runs a script or program needs the"
        " person's approval (you get a needs-approval answer and the person is asked); `rm` inside your"
        " .scratchpad/ is free. Some commands are never run (deleting whole homes or systems, sudo, disk"
        " tools, Starling's data folder, other agents' folders). No secrets are in the environment. Output"
        " (stdout and stderr merged) is capped; the process group is killed at the timeout and when the"
        " command returns: use job_start for long or background work.",
        {"type": "object", "properties": {
            "command": {"type": "string"},
            "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_S,
                          "description": f"default {DEFAULT_TIMEOUT_S}"},
        }, "required": ["command"], "additionalProperties": False}),
        "shell", shell),
]
