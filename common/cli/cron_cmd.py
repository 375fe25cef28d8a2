"""`starling cron add|list|rm|enable|disable|runs`: scheduled prompts, checked here like the agent's cron tool.

A bad expression, time zone, time, name or destination is a usage error (exit 2) naming what is wrong;
the writer being away, a taken name or an unknown job is a failure (exit 1).
"""

from __future__ import annotations

import argparse
import getpass
import time

from common import cron, db
from common.cli import output
from common.cli.context import Context
from common.cli.session_cmd import open_reader
from common.errors import InvalidInput, StarlingError, WriteRejected
from common.stores import cron_store
from schema import messages as m

DEFAULT_RUNS = 20


def register(verbs) -> None:
    cron_parser = verbs.add_parser("cron", help="scheduled prompts: add, list, remove, enable, disable, runs")
    actions = cron_parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = actions.add_parser("add", help="add a job: a prompt sent to an agent on a schedule (or once),"
                                         " its answer delivered to a chat")
    add.add_argument("name", metavar="NAME", help="a unique name (letters, digits, spaces, _ . : -)")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--schedule", metavar="EXPR", help="a cron expression: minute hour day-of-month month"
                      " day-of-week, e.g. '0 9 * * mon-fri', or @hourly, @daily, @weekly, @monthly, @yearly")
    when.add_argument("--at", metavar="ISO-TIME", help="run once at this time, e.g. 2030-05-01T09:30 (in --tz)"
                      " or 2030-05-01T07:30Z")
    add.add_argument("--tz", default="UTC", metavar="ZONE", help="IANA time zone of the schedule (default UTC),"
                     " e.g. Europe/Berlin")
    add.add_argument("--prompt", required=True, metavar="TEXT", help="what the agent is asked at each run")
    add.add_argument("--deliver-to", required=True, metavar="INSTANCE:CHAT",
                     help="the gateway instance and chat that get the answer, e.g. main:123456")
    add.add_argument("--agent", default="default", metavar="ID", help="the agent that answers (default: default)")
    add.add_argument("--misfire-grace", type=float, default=0.0, metavar="S",
                     help="how late (seconds) a missed run may still start; default: half the period,"
                          f" {cron.MIN_GRACE_S:g}s to {cron.MAX_GRACE_S:g}s (one hour for --at)")
    add.set_defaults(func=cmd_add)

    listing = actions.add_parser("list", help="every job: schedule, zone, next run, last outcome, failures")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(func=cmd_list)

    rm = actions.add_parser("rm", help="remove a job and its run history")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=cmd_rm)

    enable = actions.add_parser("enable", help="enable a job again (runs missed while disabled are not made up)")
    enable.add_argument("name", metavar="NAME")
    enable.set_defaults(func=cmd_enable)

    disable = actions.add_parser("disable", help="stop a job from running (it is kept)")
    disable.add_argument("name", metavar="NAME")
    disable.set_defaults(func=cmd_disable)

    runs = actions.add_parser("runs", help="recent runs, newest first: scheduled time, outcome, duration, error")
    runs.add_argument("name", nargs="?", metavar="NAME", help="only this job's runs")
    runs.add_argument("-n", "--limit", type=int, default=DEFAULT_RUNS, metavar="N",
                      help=f"at most N runs ({DEFAULT_RUNS})")
    runs.add_argument("--json", action="store_true", help="print JSON for scripts")
    runs.set_defaults(func=cmd_runs)


def _usage(message: str) -> int:
    output.error(message)
    return 2


def cmd_add(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    now = time.time()
    try:
        name = cron.check_name(args.name)
        cron.check_prompt(args.prompt)
        tz = cron.zone(args.tz).key
        if args.schedule is not None:
            schedule, run_at = " ".join(args.schedule.split()), 0.0
            first = cron.check_schedule(schedule, tz, now)
        else:
            schedule, run_at = "", cron.parse_at(args.at, tz, now, label="--at")
            first = run_at
        instance, chat = cron.parse_deliver_to(args.deliver_to, cron.deliver_instances(ctx.cfg))
        grace = cron.check_grace(args.misfire_grace)
    except InvalidInput as exc:
        return _usage(str(exc))
    if not (ctx.paths.agents_dir / args.agent).is_dir():
        return _usage(f"no agent {args.agent!r} (see `starling agent list`)")
    try:
        job_id = ctx.call(m.CronAdd(name=name, prompt=args.prompt, agent=args.agent, deliver_instance=instance,
                                    deliver_chat=chat, schedule=schedule, tz=tz, run_at=run_at,
                                    created_by=f"cli:{getpass.getuser()}", misfire_grace_s=grace)).id
    except WriteRejected as exc:
        raise StarlingError(f"cron job {name!r} was not added: {str(exc).split(': ', 1)[-1]}") from None
    what = f"schedule '{schedule}' ({tz})" if schedule else f"once ({tz})"
    print(f"Added cron job {name!r} (id {job_id}): {what}, first run {cron.local_iso(first, tz)},"
          f" agent {args.agent}, delivering to {instance}:{chat}.")
    return 0


def _job_rows(ctx: Context) -> list[dict]:
    conn = open_reader(ctx)
    try:
        with db.read_tx(conn):
            jobs = cron_store.list_all(conn)
            last = {job.id: cron_store.last_run_of(conn, job.id) for job in jobs}
    finally:
        conn.close()
    now = time.time()
    rows = []
    for job in jobs:
        state, next_at = cron.job_state(job, last[job.id], now)
        last_state, last_at = last[job.id] or ("", None)
        rows.append({
            "name": job.name, "state": state, "schedule": job.schedule, "tz": job.tz, "run_at": job.run_at,
            "next_run": next_at, "next_run_local": cron.local_iso(next_at, job.tz) if next_at else "",
            "agent": job.agent, "deliver_to": f"{job.deliver_instance}:{job.deliver_chat}",
            "last_run": last_state, "last_run_at": last_at,
            "last_run_local": cron.local_iso(last_at, job.tz) if last_at else "",
            "consecutive_failures": job.consecutive_failures, "disabled_reason": job.disabled_reason,
            "misfire_grace_s": job.misfire_grace_s, "prompt": job.prompt, "created_by": job.created_by,
        })
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    rows = _job_rows(Context.from_args(args))
    if args.json:
        output.emit_json(rows)
        return 0
    if not rows:
        print("No cron jobs. Add one with `starling cron add NAME --schedule EXPR --prompt TEXT"
              " --deliver-to INSTANCE:CHAT`.")
        return 0
    table = []
    for r in rows:
        state = r["state"] + (f" ({r['disabled_reason']})" if r["state"] == "disabled" and r["disabled_reason"] else "")
        when = r["schedule"] or f"at {cron.local_iso(r['run_at'] or 0, r['tz'])}"
        last = f"{r['last_run']} {r['last_run_local']}" if r["last_run"] else "-"
        table.append([r["name"], state, when, r["tz"], r["next_run_local"] or "-", r["agent"], r["deliver_to"], last,
                      r["consecutive_failures"]])
    print(output.table(["NAME", "STATE", "SCHEDULE", "TZ", "NEXT RUN", "AGENT", "DELIVER TO", "LAST RUN", "FAILURES"],
                       table))
    return 0


def _change(args: argparse.Namespace, op: m.WriteOp, done: str) -> int:
    ctx = Context.from_args(args)
    try:
        ctx.call(op)
    except WriteRejected as exc:
        raise StarlingError(f"cron job {args.name!r}: {str(exc).split(': ', 1)[-1]}") from None
    print(done)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    return _change(args, m.CronRemove(name=args.name), f"Removed cron job {args.name!r}.")


def cmd_enable(args: argparse.Namespace) -> int:
    return _change(args, m.CronSetEnabled(name=args.name, enabled=True),
                   f"Enabled cron job {args.name!r}: it runs from its next scheduled time.")


def cmd_disable(args: argparse.Namespace) -> int:
    return _change(args, m.CronSetEnabled(name=args.name, enabled=False, reason=f"by {getpass.getuser()}"),
                   f"Disabled cron job {args.name!r}.")


def cmd_runs(args: argparse.Namespace) -> int:
    if args.limit < 1:
        return _usage(f"--limit must be 1 or more, not {args.limit}")
    ctx = Context.from_args(args)
    conn = open_reader(ctx)
    try:
        with db.read_tx(conn):
            if args.name and cron_store.get_by_name(conn, args.name) is None:
                raise StarlingError(f"no cron job named {args.name!r} (see `starling cron list`)")
            runs = cron_store.recent_runs(conn, args.name, args.limit)
    finally:
        conn.close()
    rows = [{
        "job": r.job, "scheduled_for": r.scheduled_for, "scheduled_local": cron.local_iso(r.scheduled_for, r.tz),
        "state": r.state, "turn_id": r.turn_id, "started_at": r.started_at, "late_s": round(r.started_at - r.scheduled_for, 3),
        "ended_at": r.ended_at, "duration_ms": r.duration_ms, "error": r.error,
    } for r in runs]
    if args.json:
        output.emit_json(rows)
        return 0
    if not rows:
        print("No runs yet.")
        return 0
    print(output.table(
        ["JOB", "SCHEDULED FOR", "STATE", "LATE", "DURATION", "TURN", "ERROR"],
        [[r["job"], r["scheduled_local"], r["state"], output.duration(r["late_s"]) if r["state"] != "skipped" else "-",
          f"{r['duration_ms'] / 1000:.1f}s" if r["duration_ms"] is not None else "-", r["turn_id"] or "-",
          " ".join(r["error"].split())[:80]] for r in rows],
        colour_column=2))
    return 0
