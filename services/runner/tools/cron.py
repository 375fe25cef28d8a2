"""The cron tools: an agent creates, lists and removes its scheduled prompts (rows the scheduler fires).

Checked before anything is sent to the writer, by the same code as `starling cron add` (common/cron.py):
the name, the cron expression (five fields or an @macro, with croniter), the time zone (zoneinfo), a
one-shot time in the future, a destination on a configured gateway instance. A job that delivers anywhere
but the current chat needs the person's approval. Names are unique across all agents; an agent sees and
removes only its own jobs.
"""

from __future__ import annotations

import time
from typing import Any

from common import cron
from common.db import read_tx
from common.errors import InvalidInput, WriteRejected
from common.stores import cron_store
from schema import messages as m
from services.runner.llm import ToolSpec
from services.runner.tools.base import Tool, ToolContext, ToolError, ToolResult


def _deliver(ctx: ToolContext, deliver_to: str | None) -> tuple[str, str]:
    if not deliver_to:
        return ctx.instance, ctx.chat
    try:
        return cron.parse_deliver_to(deliver_to, cron.deliver_instances(ctx.cfg) | {ctx.instance})
    except InvalidInput as exc:
        raise ToolError(f"{exc} (this chat is '{ctx.instance}:{ctx.chat}')") from None


async def cron_create(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    schedule, run_at = (args.get("schedule") or "").strip(), (args.get("run_at") or "").strip()
    tz_name = args.get("tz") or "UTC"
    now = time.time()
    try:
        name = cron.check_name(args["name"])
        prompt = cron.check_prompt(args["prompt"])
        if bool(schedule) == bool(run_at):
            raise ToolError("give either schedule (a cron expression, repeating) or run_at (one time), not both")
        tz_name = cron.zone(tz_name).key
        if schedule:
            schedule = " ".join(schedule.split())
            first, stamp = cron.check_schedule(schedule, tz_name, now), 0.0
        else:
            first = stamp = cron.parse_at(run_at, tz_name, now)
    except InvalidInput as exc:
        raise ToolError(str(exc)) from None
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
    return ToolResult(f"cron job {name!r} created (id {job_id}), {what}, first run {cron.local_iso(first, tz_name)},"
                      f" delivering to {instance}:{chat}")


async def cron_list(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    with read_tx(ctx.reader()) as conn:
        jobs = cron_store.list_for_agent(conn, ctx.agent)
    if not jobs:
        return ToolResult("you have no cron jobs")
    lines = []
    for job in jobs:
        try:
            if job.schedule:
                nxt = cron.next_fire(job.schedule, job.tz, time.time())
                when = f"'{job.schedule}' {job.tz}, next {cron.local_iso(nxt, job.tz) if nxt else 'never'}"
            else:
                when = f"once at {cron.local_iso(job.run_at or 0, job.tz)}"
        except (ValueError, KeyError):
            when = f"'{job.schedule}' {job.tz} (cannot be computed)"
        prompt = " ".join(job.prompt.split())
        prompt = prompt if len(prompt) <= 120 else prompt[:120] + "…"
        state = "" if job.enabled else f" [disabled{': ' + job.disabled_reason if job.disabled_reason else ''}]"
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
