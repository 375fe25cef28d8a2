"""The cron tools: an agent creates, lists and removes its scheduled prompts (rows the scheduler fires).

Checked before anything is sent to the writer: the name, the cron expression (five fields or an @macro,
at most once a minute, with croniter), the time zone (zoneinfo), a one-shot time in the future. A job
that delivers anywhere but the current chat needs the person's approval. Names are unique across all
agents; an agent sees and removes only its own jobs.
"""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from common.db import read_tx
from common.errors import WriteRejected
from common.stores import cron_store
from schema import messages as m
from services.runner.llm import ToolSpec
from services.runner.tools.base import Tool, ToolContext, ToolError, ToolResult

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.:-]{0,63}$")
MACROS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
MAX_PROMPT = 8 * 1024


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris' or 'UTC'") from None


def check_schedule(schedule: str, tz: ZoneInfo) -> datetime:
    """The next fire time of a valid expression; ToolError naming the problem otherwise."""
    fields = schedule.split()
    if not (len(fields) == 5 or (len(fields) == 1 and fields[0].lower() in MACROS)):
        raise ToolError(f"invalid cron expression {schedule!r}: use five fields (minute hour day-of-month"
                        " month day-of-week, e.g. '0 9 * * mon-fri') or one of " + ", ".join(sorted(MACROS)))
    if not croniter.is_valid(schedule):
        raise ToolError(f"invalid cron expression {schedule!r}: a field is out of range or malformed"
                        " (e.g. '0 9 * * mon-fri' is 09:00 on weekdays)")
    return croniter(schedule, datetime.now(tz)).get_next(datetime)


def check_run_at(run_at: str, tz: ZoneInfo) -> float:
    try:
        when = datetime.fromisoformat(run_at.strip())
    except ValueError:
        raise ToolError(f"invalid run_at {run_at!r}: use ISO 8601, e.g. '2030-05-01T09:30' (in tz) or"
                        " '2030-05-01T07:30Z'") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=tz)
    stamp = when.timestamp()
    if stamp <= time.time():
        raise ToolError(f"run_at {when.isoformat()} is in the past")
    return stamp


def _deliver(ctx: ToolContext, deliver_to: str | None) -> tuple[str, str]:
    if not deliver_to:
        return ctx.instance, ctx.chat
    instance, sep, chat = deliver_to.partition(":")
    if not sep or not instance or not chat:
        raise ToolError(f"invalid deliver_to {deliver_to!r}: expected 'instance:chat'"
                        f" (this chat is '{ctx.instance}:{ctx.chat}')")
    return instance, chat


async def cron_create(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    name, prompt = args["name"].strip(), args["prompt"]
    schedule, run_at = (args.get("schedule") or "").strip(), (args.get("run_at") or "").strip()
    if not NAME.match(name):
        raise ToolError(f"invalid name {name!r}: 1-64 letters, digits, spaces and _ . : - (starting with a"
                        " letter or digit)")
    if not prompt.strip() or len(prompt) > MAX_PROMPT:
        raise ToolError(f"the prompt must be 1-{MAX_PROMPT} characters")
    if bool(schedule) == bool(run_at):
        raise ToolError("give either schedule (a cron expression, repeating) or run_at (one time), not both")
    tz_name = args.get("tz") or "UTC"
    tz = zone(tz_name)
    if schedule:
        when = check_schedule(schedule, tz)
        first = when.isoformat(timespec="minutes")
        stamp = 0.0
    else:
        stamp = check_run_at(run_at, tz)
        first = datetime.fromtimestamp(stamp, tz).isoformat(timespec="minutes")
    instance, chat = _deliver(ctx, args.get("deliver_to"))
    if (instance, chat) != (ctx.instance, ctx.chat) and not ctx.approved:
        return ToolResult("Delivering to another chat needs the person's approval; they have been asked.",
                          outcome="needs_approval",
                          approval_reason=f"create cron job {name!r} that sends to {instance}:{chat}")
    with read_tx(ctx.reader()) as conn:
        existing = cron_store.get_by_name(conn, name)
    if existing is not None:
        raise ToolError(f"a cron job named {name!r} already exists; remove it first or choose another name")
    try:
        result = await ctx.call(m.CronAdd(name=name, prompt=prompt, agent=ctx.agent, deliver_instance=instance,
                                          deliver_chat=chat, schedule=schedule, tz=tz_name, run_at=stamp,
                                          created_by=f"agent:{ctx.agent}"))
    except WriteRejected as e:
        raise ToolError(f"the cron job was not created: {e}") from None
    job_id = result.id if isinstance(result, m.Stored) else 0
    what = f"schedule '{schedule}' ({tz_name})" if schedule else f"once ({tz_name})"
    return ToolResult(f"cron job {name!r} created (id {job_id}), {what}, first run {first},"
                      f" delivering to {instance}:{chat}")


async def cron_list(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    with read_tx(ctx.reader()) as conn:
        jobs = cron_store.list_for_agent(conn, ctx.agent)
    if not jobs:
        return ToolResult("you have no cron jobs")
    lines = []
    for job in jobs:
        try:
            tz = ZoneInfo(job.tz)
            if job.schedule:
                nxt = croniter(job.schedule, datetime.now(tz)).get_next(datetime).isoformat(timespec="minutes")
                when = f"'{job.schedule}' {job.tz}, next {nxt}"
            else:
                when = f"once at {datetime.fromtimestamp(job.run_at or 0, tz).isoformat(timespec='minutes')}"
        except (ZoneInfoNotFoundError, ValueError, KeyError):
            when = f"'{job.schedule}' {job.tz} (cannot be computed)"
        prompt = " ".join(job.prompt.split())
        prompt = prompt if len(prompt) <= 120 else prompt[:120] + "…"
        state = "" if job.enabled else " [disabled]"
        lines.append(f"- {job.name}{state}: {when} → {job.deliver_instance}:{job.deliver_chat}: {prompt}")
    return ToolResult("\n".join(lines))


async def cron_remove(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    name = args["name"].strip()
    with read_tx(ctx.reader()) as conn:
        job = cron_store.get_by_name(conn, name)
    if job is None or job.agent != ctx.agent:
        raise ToolError(f"you have no cron job named {name!r} (cron_list shows yours)")
    try:
        await ctx.call(m.CronRemove(name=name))
    except WriteRejected as e:
        raise ToolError(f"the cron job was not removed: {e}") from None
    return ToolResult(f"cron job {name!r} removed")


TOOLS = [
    Tool(ToolSpec(
        "cron_create",
        "Schedule a prompt for yourself: at each time it fires you get `prompt` as a message and your answer"
        " goes to the chat. Give `schedule` (cron: minute hour day-of-month month day-of-week, e.g."
        " '0 9 * * mon-fri', or @daily, @hourly …) or `run_at` (one time, ISO 8601). `tz` is an IANA zone"
        " (default UTC). `deliver_to` defaults to this chat ('instance:chat'); another chat needs approval.",
        {"type": "object", "properties": {
            "name": {"type": "string", "description": "unique name"},
            "prompt": {"type": "string"},
            "schedule": {"type": "string"},
            "run_at": {"type": "string"},
            "tz": {"type": "string"},
            "deliver_to": {"type": "string"},
        }, "required": ["name", "prompt"], "additionalProperties": False}),
        "cron", cron_create),
    Tool(ToolSpec("cron_list", "Your cron jobs: schedule, zone, next run, where they deliver, their prompt.",
                  {"type": "object", "properties": {}, "additionalProperties": False}),
         "cron", cron_list),
    Tool(ToolSpec("cron_remove", "Remove one of your cron jobs by name.",
                  {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
                   "additionalProperties": False}),
         "cron", cron_remove),
]
