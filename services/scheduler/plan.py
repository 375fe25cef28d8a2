"""What the scheduler does about one job now: a pure function of the job, its last fire and the time.

- Fires are due in (after, now], ``after`` being the job's latest run row or the time it was added or
  enabled, whichever is later.
- Of the due fires only the latest may run, and only when it is late by no more than the job's misfire
  grace (``common.cron``: by default half its period, 30 s to 1 h; one hour for a one-shot job) and the
  job's previous run has ended. Every other due fire is recorded as skipped, with the reason: nothing is
  replayed in a burst after downtime.
- After a long outage only the last ``MAX_SKIPPED`` missed fires are looked at and recorded; the
  decision says so and the scheduler logs it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from common import cron
from common.stores.cron_store import CronJob

MAX_SKIPPED = 1000

Skips = tuple[tuple[tuple[float, ...], str], ...]  # (scheduled times, reason) groups


@dataclass(frozen=True)
class Decision:
    fire: float | None = None  # the scheduled time to run now
    skips: Skips = ()  # scheduled times to record as skipped, with why
    next_at: float | None = None  # the job's next fire after now (None: it never fires again)
    unrecorded_before: float | None = None  # a long outage: missed fires before this are not recorded


def decide(job: CronJob, last_scheduled: float | None, now: float, busy_with: float | None = None) -> Decision:
    """``busy_with``: the scheduled time of the job's run whose turn has not ended yet, if any."""
    after = max(job.active_since, last_scheduled if last_scheduled is not None else job.active_since)
    if not job.schedule:
        return _one_shot(job, after, now, busy_with)
    first = cron.next_fire(job.schedule, job.tz, after)
    if first is None or first > now:
        return Decision(next_at=first)
    due, unrecorded_before = _due(job, after, now)
    latest = due[-1]
    skips: list[tuple[tuple[float, ...], str]] = []
    if len(due) > 1:
        skips.append((tuple(due[:-1]), f"missed: the scheduler was not running then; only the latest missed fire"
                                       f" ({cron.local_iso(latest, job.tz)}) may run"))
    fire, reason = _latest(job, latest, now, busy_with)
    if reason:
        skips.append(((latest,), reason))
    return Decision(fire=fire, skips=tuple(skips), next_at=cron.next_fire(job.schedule, job.tz, now),
                    unrecorded_before=unrecorded_before)


def _one_shot(job: CronJob, after: float, now: float, busy_with: float | None) -> Decision:
    run_at = job.run_at or 0.0
    if run_at <= after:  # fired or skipped already, or its time passed before it was added or enabled
        return Decision()
    if run_at > now:
        return Decision(next_at=run_at)
    fire, reason = _latest(job, run_at, now, busy_with)
    return Decision(fire=fire, skips=(((run_at,), reason),) if reason else ())


def _latest(job: CronJob, scheduled: float, now: float, busy_with: float | None) -> tuple[float | None, str]:
    """(the time to fire, "") or (None, why it is skipped) for a job's latest due fire."""
    grace = job.misfire_grace_s or cron.default_grace(job.schedule, job.tz, scheduled)
    late = now - scheduled
    if late > grace:
        return None, f"missed by {late:.0f}s, more than the misfire grace of {grace:.0f}s"
    if busy_with is not None:
        return None, f"the run of {cron.local_iso(busy_with, job.tz)} had not ended"
    return scheduled, ""


def _due(job: CronJob, after: float, now: float) -> tuple[list[float], float | None]:
    """The fires in (after, now], oldest first: all of them, or after a long outage the last MAX_SKIPPED + 1
    (and the time before which the rest were not looked at)."""
    head = cron.fires_between(job.schedule, job.tz, after, now, limit=MAX_SKIPPED + 2)
    if len(head) <= MAX_SKIPPED + 1:
        return head, None
    # enumerate only about the last MAX_SKIPPED + 1 periods (the shortest period seen stands for them all)
    shortest = min(b - a for a, b in zip(head, head[1:]))
    start = max(after, now - (MAX_SKIPPED + 1) * shortest)
    recent: deque[float] = deque(maxlen=MAX_SKIPPED + 1)
    for fire in cron.iter_fires(job.schedule, job.tz, start):
        if fire > now:
            break
        recent.append(fire)
    return list(recent), recent[0]
