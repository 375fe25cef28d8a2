"""Cron jobs as values: checking what a person or an agent asks for, and when a job fires.

Shared by `starling cron add`, the agent's cron tools, the writer (which refuses what these refuse)
and the scheduler, so that all of them agree. Every check raises InvalidInput with a message that names
the value and what is expected.

Fire times are computed on the job's wall clock with croniter (naive local times, so croniter never sees
a daylight-saving change), then placed on the time line with zoneinfo:

- a wall time that happens twice (clocks go back) fires once, at its first occurrence; a job whose hour
  field is ``*`` (it runs every hour, or more often) follows elapsed time instead and fires at both;
- a wall time that does not exist (clocks go forward) fires at the end of the gap, the first moment after
  the change; a job whose hour field is ``*`` has nothing to fire there (that hour did not happen).

So a wall-clock job (``30 2 * * *``) runs once on both change days, and an hourly one runs every real hour.
"""

from __future__ import annotations

import heapq
import math
import re
from datetime import datetime
from typing import TYPE_CHECKING, Collection, Iterator

from common.errors import InvalidInput

if TYPE_CHECKING:
    from zoneinfo import ZoneInfo

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.:-]{0,63}$")
MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}
MAX_PROMPT = 8 * 1024

# Misfire grace: how late a missed fire may still run. By default half the job's period (the time to its
# next fire), at least MIN_GRACE_S and at most MAX_GRACE_S; a one-shot job's is ONE_SHOT_GRACE_S.
# Half the period means only the latest missed fire can ever be within its grace: never a burst.
MIN_GRACE_S = 30.0
MAX_GRACE_S = 3600.0
ONE_SHOT_GRACE_S = 3600.0
MAX_GRACE_SETTING_S = 7 * 86400.0

_SHIFT_S = 3 * 3600.0  # the largest daylight-saving shift looked around for (real ones: 30 min to 2 h)


# ---------------------------------------------------------------- checks


def check_name(name: str) -> str:
    name = name.strip()
    if not NAME.match(name):
        raise InvalidInput(f"invalid name {name!r}: 1-64 letters, digits, spaces and _ . : - (starting with a"
                           " letter or digit)")
    return name


def check_prompt(prompt: str) -> str:
    if not prompt.strip() or len(prompt) > MAX_PROMPT:
        raise InvalidInput(f"the prompt must be 1-{MAX_PROMPT} characters")
    return prompt


def zone(name: str) -> ZoneInfo:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError  # here: the writer checks jobs, only the scheduler fires them

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Paris' or 'UTC'") from None


def expand(schedule: str) -> str:
    """The five-field form of an expression (macros such as @daily spelled out)."""
    schedule = " ".join(schedule.split())
    return MACROS.get(schedule.lower(), schedule)


def check_schedule(schedule: str, tz_name: str, now: float) -> float:
    """The first fire time after ``now`` of a valid expression in a valid zone; InvalidInput otherwise."""
    from croniter import croniter

    tz = zone(tz_name)
    fields = schedule.split()
    if not (len(fields) == 5 or (len(fields) == 1 and fields[0].lower() in MACROS)):
        raise InvalidInput(f"invalid cron expression {schedule!r}: use five fields (minute hour day-of-month"
                           " month day-of-week, e.g. '0 9 * * mon-fri') or one of " + ", ".join(sorted(MACROS)))
    if not croniter.is_valid(expand(schedule)):
        raise InvalidInput(f"invalid cron expression {schedule!r}: a field is out of range or malformed"
                           " (e.g. '0 9 * * mon-fri' is 09:00 on weekdays)")
    first = next_fire(schedule, tz.key, now)
    if first is None:
        raise InvalidInput(f"cron expression {schedule!r} never fires (a day that no month has?)")
    return first


def parse_at(text: str, tz_name: str, now: float, label: str = "run_at") -> float:
    """A one-shot time: ISO 8601, in ``tz_name`` unless it carries an offset; it must be in the future."""
    tz = zone(tz_name)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"invalid {label} {text!r}: use ISO 8601, e.g. '2030-05-01T09:30' (in tz) or"
                           " '2030-05-01T07:30Z'") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=tz)
    stamp = when.timestamp()
    if stamp <= now:
        raise InvalidInput(f"{label} {when.isoformat()} is in the past")
    return stamp


def deliver_instances(cfg) -> set[str]:
    """Where a cron job may deliver: the configured gateway instances, and `cli` (`starling chat`)."""
    return {gw.id for gw in cfg.gateways.all()} | {"cli"}


def parse_deliver_to(text: str, instances: Collection[str] | None = None) -> tuple[str, str]:
    """``instance:chat`` split in two; with ``instances``, the instance must be one of them."""
    instance, sep, chat = text.strip().partition(":")
    if not sep or not instance or not chat:
        raise InvalidInput(f"invalid deliver_to {text!r}: expected 'instance:chat'")
    if instances is not None and instance not in instances:
        raise InvalidInput(f"unknown gateway instance {instance!r} in deliver_to {text!r}; configured: "
                           + ", ".join(sorted(instances)))
    return instance, chat


def check_grace(seconds: float) -> float:
    """A job's own misfire grace: 0 (the default, derived from its period) or up to 7 days."""
    if not (seconds == 0 or MIN_GRACE_S <= seconds <= MAX_GRACE_SETTING_S):
        raise InvalidInput(f"misfire grace must be 0 (default: half the period, {MIN_GRACE_S:g}s to"
                           f" {MAX_GRACE_S:g}s) or {MIN_GRACE_S:g}..{MAX_GRACE_SETTING_S:g} seconds, not {seconds}")
    return seconds


def check_job(name: str, prompt: str, schedule: str, tz_name: str, run_at: float, grace_s: float,
              instance: str, chat: str, now: float) -> None:
    """What every new job must be (the writer's check; callers check more first, e.g. run_at in the future)."""
    check_name(name)
    check_prompt(prompt)
    if bool(schedule) == bool(run_at):
        raise InvalidInput("a cron job needs a schedule or a run_at time, not both")
    if schedule:
        check_schedule(schedule, tz_name, now)
    else:
        zone(tz_name)
        if not math.isfinite(run_at) or run_at <= 0:
            raise InvalidInput(f"invalid run_at {run_at}")
    check_grace(grace_s)
    if not instance or not chat:
        raise InvalidInput("a cron job needs a gateway instance and a chat to deliver to")


# ---------------------------------------------------------------- fire times


def iter_fires(schedule: str, tz_name: str, after: float) -> Iterator[float]:
    """Fire times (epoch seconds) strictly after ``after``, in order, without end.

    croniter's CroniterBadDateError ends an expression that stops firing."""
    from zoneinfo import ZoneInfo

    from croniter import croniter

    expr = expand(schedule)
    tz = ZoneInfo(tz_name)
    every_hour = expr.split()[1] == "*"
    margin = _SHIFT_S if _offset_changes_near(tz, after) else 0.0
    walls = croniter(expr, datetime.fromtimestamp(after - margin, tz).replace(tzinfo=None))
    waiting: list[float] = []  # candidates not yet safe to hand out (a later wall time may place earlier)
    last = after
    while True:
        primary, candidates = _place(walls.get_next(datetime), tz, every_hour)
        for candidate in candidates:
            if candidate > last:
                heapq.heappush(waiting, candidate)
        # every later wall time places at or after `primary`: what is not later than it is final
        while waiting and waiting[0] <= primary:
            candidate = heapq.heappop(waiting)
            if candidate > last:
                last = candidate
                yield candidate


def next_fire(schedule: str, tz_name: str, after: float) -> float | None:
    """The first fire time after ``after``; None when the expression never fires again."""
    from croniter import CroniterBadDateError

    try:
        return next(iter_fires(schedule, tz_name, after))
    except CroniterBadDateError:
        return None


def fires_between(schedule: str, tz_name: str, after: float, until: float, limit: int = 100_000) -> list[float]:
    """Fire times in (after, until], at most ``limit`` (the earliest)."""
    from croniter import CroniterBadDateError

    found: list[float] = []
    try:
        for fire in iter_fires(schedule, tz_name, after):
            if fire > until or len(found) >= limit:
                break
            found.append(fire)
    except CroniterBadDateError:
        pass
    return found


def default_grace(schedule: str, tz_name: str, fire: float) -> float:
    """Half the time from ``fire`` to the job's next fire, within [MIN_GRACE_S, MAX_GRACE_S];
    ONE_SHOT_GRACE_S for a one-shot job (no schedule)."""
    if not schedule:
        return ONE_SHOT_GRACE_S
    following = next_fire(schedule, tz_name, fire)
    if following is None:
        return MAX_GRACE_S
    return min(max((following - fire) / 2, MIN_GRACE_S), MAX_GRACE_S)


def local_iso(stamp: float, tz_name: str) -> str:
    """A time for people, in the job's zone: 2025-03-30T03:00+02:00."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        tz = ZoneInfo("UTC")
    return datetime.fromtimestamp(stamp, tz).isoformat(timespec="minutes")


def _place(wall: datetime, tz: ZoneInfo, every_hour: bool) -> tuple[float, list[float]]:
    """(primary instant, fire instants) of one naive wall time. Primary instants never decrease as wall
    times increase, and every fire instant is at or after its primary."""
    first = wall.replace(tzinfo=tz).timestamp()  # fold=0: the offset before a change
    second = wall.replace(tzinfo=tz, fold=1).timestamp()  # fold=1: the offset after it
    if first == second:
        return first, [first]
    if first < second:  # happens twice (clocks went back), `second - first` apart
        return first, [first, second] if every_hour else [first]
    change = _change_between(tz, second, first)  # does not exist (clocks went forward)
    return change, [] if every_hour else [change]


def _change_between(tz: ZoneInfo, before: float, after: float) -> float:
    """The instant the UTC offset changes, in (before, after]: the first second of the new offset."""
    low, high = math.floor(before), math.ceil(after)
    new = datetime.fromtimestamp(high, tz).utcoffset()
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).utcoffset() == new:
            high = middle
        else:
            low = middle
    return float(high)


def _offset_changes_near(tz: ZoneInfo, when: float) -> bool:
    offsets = {datetime.fromtimestamp(when + d, tz).utcoffset() for d in (-_SHIFT_S, 0.0, _SHIFT_S)}
    return len(offsets) > 1


def job_state(job, last_run: object, now: float) -> tuple[str, float | None]:
    """A cron job as `starling cron list` and the dashboard say it: ("enabled", its next fire), ("disabled",
    None), or ("done", None) for a one-shot that ran. ``job`` is a cron_store.CronJob; ``last_run`` its
    latest run, or None."""
    if not job.schedule:
        if last_run is not None or (job.run_at or 0) <= job.active_since:
            return "done", None
        return ("enabled" if job.enabled else "disabled"), (job.run_at if job.enabled else None)
    if not job.enabled:
        return "disabled", None
    try:
        return "enabled", next_fire(job.schedule, job.tz, now)
    except (ValueError, KeyError):
        return "enabled", None
