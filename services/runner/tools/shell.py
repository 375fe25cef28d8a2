"""The shell tool: one command line in the agent's private workspace, classed (classify.py), confined, bounded.

The command runs with ``bash -c`` under the kernel sandbox (services/runner/sandbox: Landlock, namespaces,
rlimits, no capabilities), in its own session (process group), with cwd and $HOME the agent's private
workspace, stdin closed, stdout and stderr merged, and an environment of PATH (absolute entries outside
the workspace only), HOME, TMPDIR (inside the private folder), LANG, TERM=dumb and a few pager and git
settings: no STARLING_*, no keys or tokens. On timeout, and whenever the command returns, its whole
process group is killed (background work belongs in job_start).

The classifier is the courtesy layer (it asks before destructive work inside the workspace); the sandbox
is what confines, whatever the classifier misjudged, approval mode ``auto`` included. Network access is
granted only to a call that asked for it (``network: true``) and that a person approved (once, or with
a standing grant): ``auto`` never grants it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path
from typing import Any

from common import sandbox
from services.runner.llm import ToolSpec
from services.runner.tools import confine
from services.runner.tools.base import Refused, Tool, ToolContext, ToolResult
from services.runner.tools.classify import ASK, READ, REFUSE, SCRATCH, classify

__all__ = ["classify", "READ", "ASK", "REFUSE", "SCRATCH", "TOOLS", "command_env", "gate", "spawn_confined"]

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
        "TMPDIR": str(sandbox.private_tmp(home)),
        "LANG": os.environ.get("LANG", "C.UTF-8") or "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
    }
    env.update(_GIT_ENV)
    return env


def sandbox_for(ctx: ToolContext) -> sandbox.Sandbox:
    """The layers in force for this runner (probed once); Refused when code-running tools are off here."""
    found = sandbox.probe(ctx.cfg.tools.sandbox)
    if not found.usable:
        raise Refused(found.off_reason())
    return found


def network_allowed(ctx: ToolContext) -> bool:
    """A person approved this very call (or made a standing grant); approval mode ``auto`` never counts."""
    return ctx.approved and not ctx.auto_approved


def gate(ctx: ToolContext, command: str, what: str = "run", *, network: bool = False) -> ToolResult | None:
    """None when the command may run now; else the refused or needs_approval result."""
    sandbox_for(ctx)
    level, reason = classify(command, ctx)
    if level == REFUSE:
        raise Refused(f"{reason}. This command is never run, even with approval.")
    if network:
        if ctx.approved and ctx.auto_approved:
            raise Refused("network access needs a person's approval, and this agent's approval mode is auto, which"
                          " never grants it; run the command without network: true")
        if not ctx.approved:
            level, reason = ASK, f"{reason}; with network access" if level == ASK else "with network access"
    if level == ASK and not ctx.approved:
        return ToolResult(
            f"This command needs the person's approval ({reason}); they have been asked. Wait for their answer.",
            outcome="needs_approval", approval_reason=f"{what} `{command}` ({reason})")
    return None


async def spawn_confined(ctx: ToolContext, command: str, *, network: bool, job: bool = False,
                         **kw: Any) -> asyncio.subprocess.Process:
    """``bash -c command`` in the agent's private folder, under the sandbox, in a process group of its own."""
    found = sandbox_for(ctx)
    home = confine.private_dir(ctx)
    shell_cfg = ctx.cfg.tools.shell
    policy = sandbox.policy_for(ctx.paths, ctx.agent, sandbox.limits_for(shell_cfg, job=job),
                                network=network and network_allowed(ctx), extra_read=tuple(shell_cfg.read_paths))
    return await sandbox.spawn(found, policy, [_bash(), "-c", command], cwd=str(home),
                               env=command_env(ctx, home), stdin=asyncio.subprocess.DEVNULL, **kw)


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


async def run_command(ctx: ToolContext, command: str, timeout_s: float, *,
                      network: bool = False) -> tuple[int | None, bytes, int]:
    """(exit code or None on timeout, captured output, total output size) of one confined command.

    The output pipe is ours, not asyncio's subprocess pipe: the exit is seen when the command exits even
    if something it started in the background (or in a session of its own) still holds the pipe.
    """
    rfd, wfd = os.pipe()
    try:
        proc = await spawn_confined(ctx, command, network=network, stdout=wfd, stderr=wfd)
    except BaseException:
        os.close(rfd)
        raise
    finally:
        os.close(wfd)
    namespace = sandbox.namespace_of(proc.pid)  # set before exec: what it starts, setsid or not, shares it
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
        await asyncio.to_thread(sandbox.kill_namespace, namespace)
        reader.cancel()
        transport.close()
    return code, bytes(keep), total


async def shell(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    command = args["command"]
    if not command.strip():
        return ToolResult("the command is empty", outcome="error")
    timeout_s = args.get("timeout_s", DEFAULT_TIMEOUT_S)
    network = bool(args.get("network", False))
    stop = gate(ctx, command, network=network)
    if stop is not None:
        return stop
    code, out, total = await run_command(ctx, command, timeout_s, network=network)
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
        " tools, Starling's data folder, other agents' folders). Commands run in a sandbox: they can read the"
        " system and write only the shared workspace and your private folder (TMPDIR is inside it; /tmp is"
        " not writable), and have no network unless you set network: true and the person approves."
        " No secrets are in the environment. Output (stdout and stderr merged) is capped; the process group"
        " is killed at the timeout and when the command returns: use job_start for long or background work.",
        {"type": "object", "properties": {
            "command": {"type": "string"},
            "network": {"type": "boolean", "description": "the command needs the network (asks the person)"},
            "timeout_s": {"type": "integer", "minimum": 1, "maximum": MAX_TIMEOUT_S,
                          "description": f"default {DEFAULT_TIMEOUT_S}"},
        }, "required": ["command"], "additionalProperties": False}),
        "shell", shell),
]
