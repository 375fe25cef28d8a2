"""The writer's cron operations: jobs added, removed, enabled and disabled; fires, skips and outcomes of runs.

A fire stores the run row keyed by (job, scheduled time) and the job's agent turn in one commit, so a
replayed or a second scheduler's fire finds the row and changes nothing. An outcome is read from the run's
turn, here, inside the transaction: the scheduler only says which run to look at.
"""

from __future__ import annotations

import math

from common import cron
from common.errors import InvalidInput
from common.stores import cron_store, turn_store
from schema import messages as m
from services.writer import apply as ops  # circular on purpose: apply dispatches here, this raises its Rejected
from services.writer import inbound_ops

MAX_SKIPS_PER_OP = 1000
FINISHED = {"done": "ok", "failed": "failed"}


def _invalid(exc: InvalidInput) -> Exception:
    return ops.Rejected("invalid", str(exc))


def _changed(events: list, job_id: int) -> None:
    events.append((m.TOPIC_CRON, m.CronChanged, {"job_id": job_id}))


def add(conn, op: m.CronAdd, now: float, events: list) -> m.Stored:
    try:
        cron.check_job(op.name, op.prompt, op.schedule, op.tz, op.run_at, op.misfire_grace_s, op.deliver_instance,
                       op.deliver_chat, now)
    except InvalidInput as exc:
        raise _invalid(exc) from None
    if not math.isfinite(op.active_since) or op.active_since < 0:
        raise ops.Rejected("invalid", f"active_since must be a time, not {op.active_since}")
    if cron_store.get_by_name(conn, op.name) is not None:
        raise ops.Rejected("conflict", f"a cron job named {op.name!r} already exists")
    job_id = cron_store.add(conn, op.name, op.schedule, op.tz, op.run_at or None, op.prompt, op.agent,
                            op.deliver_instance, op.deliver_chat, op.created_by, now, op.misfire_grace_s or None,
                            op.active_since or now)
    _changed(events, job_id)
    return m.Stored(id=job_id)


def remove(conn, op: m.CronRemove, events: list) -> m.Done:
    job = cron_store.get_by_name(conn, op.name)
    if job is None or not cron_store.remove(conn, op.name):
        raise ops.Rejected("not_found", f"no cron job named {op.name!r}")
    _changed(events, job.id)
    return m.Done()


def set_enabled(conn, op: m.CronSetEnabled, now: float, events: list) -> m.Done:
    job = cron_store.get_by_name(conn, op.name)
    if job is None:
        raise ops.Rejected("not_found", f"no cron job named {op.name!r}")
    if not math.isfinite(op.active_since) or op.active_since < 0:
        raise ops.Rejected("invalid", f"active_since must be a time, not {op.active_since}")
    if op.enabled and not job.enabled:
        cron_store.enable(conn, job.id, op.active_since or now, now)
    elif not op.enabled and job.enabled:
        cron_store.disable(conn, job.id, op.reason, now)
    else:
        return m.Done()  # already so: nothing changes, not even when its fires count from
    _changed(events, job.id)
    return m.Done()


def fire(conn, op: m.CronFire, now: float, events: list) -> m.Accepted:
    job = _job(conn, op.job_id)
    _check_time(op.scheduled_for)
    existing = cron_store.run_at(conn, job.id, op.scheduled_for)
    if existing is not None:  # fired (or skipped) already: by a replay, or by another scheduler
        turn_id = existing.turn_id or 0
        session_id = (turn_store.session_of(conn, turn_id) or 0) if turn_id else 0
        return m.Accepted(turn_id=turn_id, session_id=session_id, duplicate=True)
    if not job.enabled:
        raise ops.Rejected("conflict", f"cron job {job.name!r} is disabled")
    started_at = op.started_at if op.started_at > 0 and math.isfinite(op.started_at) else now
    inbound = m.Inbound(
        agent=job.agent, instance=job.deliver_instance, chat=job.deliver_chat, sender=f"cron:{job.name}",
        sender_name=f"cron job {job.name}", text=job.prompt, dedupe_keys=[fire_key(job, op.scheduled_for)],
    )  # the run's job and time are in cron_runs (add_run below), keyed to the turn
    accepted = inbound_ops.store_one(conn, inbound, now, events)
    cron_store.add_run(conn, job.id, op.scheduled_for, "fired", accepted.turn_id, started_at)
    return accepted


def skip(conn, op: m.CronSkip, now: float) -> m.Done:
    job = _job(conn, op.job_id)
    if not 0 < len(op.scheduled_for) <= MAX_SKIPS_PER_OP:
        raise ops.Rejected("invalid", f"1 to {MAX_SKIPS_PER_OP} scheduled times per skip, not {len(op.scheduled_for)}")
    at = op.at if op.at > 0 and math.isfinite(op.at) else now
    for scheduled_for in op.scheduled_for:
        _check_time(scheduled_for)
        cron_store.add_run(conn, job.id, scheduled_for, "skipped", None, at, op.reason[:500])
    return m.Done()


def end_run(conn, op: m.CronRunEnd, now: float, events: list) -> m.CronRunEnded:
    run = cron_store.get_run(conn, op.run_id)
    if run is None:
        raise ops.Rejected("not_found", f"cron run {op.run_id} does not exist")
    job = _job(conn, run.job_id)
    if run.state != "fired":  # recorded already
        return m.CronRunEnded(outcome=run.state, consecutive_failures=job.consecutive_failures)
    outcome, error, duration_ms = _outcome(conn, run)
    if outcome is None:
        raise ops.Rejected("conflict", f"the turn of cron run {run.id} has not ended")
    cron_store.end_run(conn, run.id, outcome, run.started_at + (duration_ms or 0) / 1000, duration_ms, error)
    failures = cron_store.count_outcome(conn, job.id, outcome == "failed")
    limit = op.max_consecutive_failures
    if not (limit > 0 and failures >= limit and job.enabled):
        return m.CronRunEnded(outcome=outcome, consecutive_failures=failures)
    reason = f"{failures} consecutive failures (last: {error or 'no error text'})"[:500]
    cron_store.disable(conn, job.id, reason, now)
    _changed(events, job.id)
    if op.alert_instance and op.alert_chat:
        text = (f"Starling: cron job {job.name!r} failed {failures} times in a row and is now disabled. Last error:"
                f" {error or 'none recorded'}. Re-enable it with `starling cron enable {job.name}`.")
        ops._enqueue(conn, None, None, op.alert_instance, op.alert_chat, [m.Reply(text=text[:3500])], now, events)
    return m.CronRunEnded(outcome=outcome, consecutive_failures=failures, disabled=True)


def fire_key(job: cron_store.CronJob, scheduled_for: float) -> str:
    """The dedupe key of a fire's turn: the job (its id and creation, as ids can be reused) and the time."""
    return f"cron:{job.id}:{job.created_at!r}:{scheduled_for!r}"


def _outcome(conn, run: cron_store.Run) -> tuple[str | None, str, float | None]:
    """(ok | failed | None while the turn runs, error, duration in ms) of a fired run, from its turn."""
    turn = cron_store.turn_outcome(conn, run.turn_id) if run.turn_id else None
    if turn is None:
        return "failed", "the run's turn is gone", None
    outcome = FINISHED.get(turn.state or "")
    if outcome is None:
        return None, "", None
    duration_ms = max(0.0, ((turn.done_at or turn.created_at) - turn.created_at) * 1000)
    return outcome, turn.error if outcome == "failed" else "", duration_ms


def _job(conn, job_id: int) -> cron_store.CronJob:
    job = cron_store.get(conn, job_id)
    if job is None:
        raise ops.Rejected("not_found", f"cron job {job_id} does not exist")
    return job


def _check_time(value: float) -> None:
    if not math.isfinite(value) or value <= 0:
        raise ops.Rejected("invalid", f"a scheduled time must be a positive epoch time, not {value}")
