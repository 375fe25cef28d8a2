"""Background jobs: job_start runs a command on its own with its output in data/jobs/, job_status reads it back.

A job is classed like a shell command (shell.gate) and confined like one (shell.spawn_confined, with the
job CPU budget of ``[tools.shell] job_cpu_s``), started in its own session with the same clean environment
and cwd, its stdout and stderr going to data/jobs/<YYYYmmdd-HHMMSS>-<slug>.log (0600), opened by the runner.
It is recorded through the writer (JobStarted → the job id); a watcher task in this runner process sends
JobEnded when it exits (done: exit 0, failed: other codes, killed: a signal). If the runner stops first,
the job keeps running and its row stays 'running' until the sweeper reconciles it (a later issue);
job_status then says the process is gone or unknown. A job that cannot be recorded is killed.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import signal
import time
from pathlib import Path
from typing import Any

from common.db import read_tx
from common.errors import StarlingError
from common.home import DIR_MODE, FILE_MODE
from common.stores import job_store
from schema import messages as m
from services.runner.llm import ToolSpec
from services.runner.tools.base import Tool, ToolContext, ToolError, ToolResult
from services.runner.tools.shell import gate, spawn_confined

TAIL_BYTES = 4096
_watchers: set[asyncio.Task] = set()  # strong references: a watcher must not be collected mid-wait


def _slug(command: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", command.lower()).strip("-")[:32] or "job"


def _open_log(ctx: ToolContext, command: str) -> tuple[Path, int]:
    folder = ctx.paths.jobs_dir
    folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for suffix in ["", *(f"-{secrets.token_hex(3)}" for _ in range(5))]:
        path = folder / f"{stamp}-{_slug(command)}{suffix}.log"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
            return path, fd
        except FileExistsError:
            continue
    raise ToolError("could not create a log file for the job")


async def _watch(ctx: ToolContext, proc: asyncio.subprocess.Process, job_id: int) -> None:
    code = await proc.wait()
    state = "done" if code == 0 else ("killed" if code < 0 else "failed")
    try:
        await ctx.call(m.JobEnded(job_id=job_id, state=state, exit_code=code))
    except (StarlingError, OSError) as e:
        ctx.log.warning("job_end_not_recorded", job_id=job_id, error=str(e))


async def job_start(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    command = args["command"]
    if not command.strip():
        return ToolResult("the command is empty", outcome="error")
    network = bool(args.get("network", False))
    stop = gate(ctx, command, "start the background job", network=network)
    if stop is not None:
        return stop
    log_path, fd = _open_log(ctx, command)
    try:  # the log is opened here and handed over: the job itself cannot reach data/jobs/
        proc = await spawn_confined(ctx, command, network=network, job=True, stdout=fd, stderr=fd)
    finally:
        os.close(fd)
    try:
        result = await ctx.call(m.JobStarted(agent=ctx.agent, session_id=ctx.session_id, command=command,
                                             log_path=str(log_path), pid=proc.pid))
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()
        raise
    job_id = result.id if isinstance(result, m.Stored) else 0
    task = asyncio.get_running_loop().create_task(_watch(ctx, proc, job_id))
    _watchers.add(task)
    task.add_done_callback(_watchers.discard)
    return ToolResult(f"started job {job_id} (pid {proc.pid}); its output goes to {log_path}."
                      f" Check it with job_status job_id={job_id}.")


def _tail(path: Path, jobs_dir: Path, nbytes: int) -> str:
    real, folder = Path(os.path.realpath(path)), Path(os.path.realpath(jobs_dir))
    if folder not in real.parents:
        return "(the log is not in data/jobs/; not shown)"
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return "(the log file is gone)"
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(0, size - nbytes))
        data = f.read(nbytes)
    if not data:
        return "(no output yet)"
    head = f"(last {len(data)} of {size} bytes)\n" if size > len(data) else ""
    return head + data.decode("utf-8", "replace")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def job_status(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    job_id = args["job_id"]
    with read_tx(ctx.reader()) as conn:
        job = job_store.get(conn, job_id)
    if job is None or job.agent != ctx.agent:
        return ToolResult(f"no job {job_id} of yours", outcome="error")
    state = job.state
    if state == "running":
        if job.pid and not _alive(job.pid):
            state = "running according to the record, but its process is gone (the runner may have restarted)"
        elapsed = time.time() - job.started_at
        state += f", for {elapsed:.0f}s"
    else:
        state += f", exit code {job.exit_code}" if job.exit_code is not None else ""
    tail = await asyncio.to_thread(_tail, Path(job.log_path), ctx.paths.jobs_dir, TAIL_BYTES)
    return ToolResult(f"job {job.id}: {state}\ncommand: {job.command}\nlog: {job.log_path}\n{tail}")


TOOLS = [
    Tool(ToolSpec(
        "job_start",
        "Start a command in the background (same rules, approvals and sandbox as shell, same private workspace)."
        " You"
        " get a job id and the path of its log; use job_status to follow it.",
        {"type": "object", "properties": {
            "command": {"type": "string"},
            "network": {"type": "boolean", "description": "the job needs the network (asks the person)"}},
         "required": ["command"], "additionalProperties": False}),
        "jobs", job_start),
    Tool(ToolSpec(
        "job_status",
        "A background job's state (running, done, failed, killed), exit code and the end of its output.",
        {"type": "object", "properties": {"job_id": {"type": "integer", "minimum": 1}},
         "required": ["job_id"], "additionalProperties": False}),
        "jobs", job_status),
]
