"""The scheduler: cron jobs become agent turns, each fire exactly once.

Each pass ("reconcile") reads the jobs from SQLite (read-only), records the outcome of runs whose turn has
ended, then asks ``plan.decide`` what each enabled job needs now: a fire, skips, or nothing until its next
fire time. Fires and skips go through the writer keyed by (job, scheduled time), so neither a restart nor
a second scheduler fires a time twice. Between passes it sleeps until the next fire time, at most
``[scheduler] poll_interval_s``, and wakes early on a cron event (a job added, removed, enabled, disabled),
and every second while a run's turn is still going (to record its outcome soon after it ends).
"""

from __future__ import annotations

import asyncio
import sys
from zoneinfo import ZoneInfoNotFoundError

from common import bus, cron, db
from common.errors import StarlingError, WriteRejected
from common.runtime import Runtime
from common.service import boot
from common.stores import cron_store
from schema import messages as m
from services.scheduler.clock import Clock
from services.scheduler.plan import MAX_SKIPPED, decide

WATCH_S = 1.0  # how often runs in flight are looked at
CALL_TIMEOUT_S = 30.0  # a write not acked by then is decided again on the next pass (the time has moved)
RUNNING = ("pending", "claimed", "waiting")  # turn states of a run that has not ended


class Scheduler:
    def __init__(self, rt: Runtime, clock: Clock) -> None:
        self.rt = rt
        self.svc = rt.svc
        self.log = rt.log
        self.clock = clock
        self.cfg = rt.svc.cfg.scheduler
        instance, _, chat = rt.svc.cfg.health.alert_to.partition(":")
        self.alert_to = (instance, chat)
        self.reader = None
        self.broken: dict[int, str] = {}  # job id -> the error already logged for it

    async def run(self) -> None:
        self.reader = await asyncio.to_thread(db.wait_for_schema, self.svc.paths.db_file, 60.0,
                                              stop=self.svc.stopping)
        events = bus.EventSubscriber(self.svc.endpoints.events, self.svc.key, [m.TOPIC_CRON])
        events.start()
        if self.clock.is_test:
            self.log.warning("test_clock", note="fire times follow a test clock passed in",
                             **self.clock.describe())
        await self.rt.announce_ready()
        try:
            while True:
                try:
                    wake_at, watching = await self.reconcile()
                except (StarlingError, asyncio.TimeoutError) as exc:  # the writer is away: look again soon
                    self.log.warning("reconcile_failed", error=str(exc) or type(exc).__name__)
                    wake_at, watching = None, True
                await events.drain(self._sleep_s(wake_at, watching))
        finally:
            events.close()
            self.reader.close()

    def _sleep_s(self, wake_at: float | None, watching: bool) -> float:
        delay = self.cfg.poll_interval_s
        if watching:
            delay = min(delay, WATCH_S)
        if wake_at is not None:
            delay = min(delay, self.clock.real_seconds(wake_at - self.clock.now()) + 0.002)
        return max(0.0, min(delay, self.clock.max_sleep_s))

    # ------------------------------------------------------------ one pass

    async def reconcile(self) -> tuple[float | None, bool]:
        """Record ended runs, then fire and skip what is due. Returns (the next fire time of any job,
        whether a run is still going)."""
        for run in self._read(cron_store.open_runs):
            if run.turn_state not in RUNNING:
                await self._end(run)
        now = self.clock.now()
        jobs, last, busy = self._read(self._snapshot)
        wake_at: float | None = None
        for job in jobs:
            try:
                decision = decide(job, last.get(job.id), now, busy.get(job.id))
            except (ValueError, KeyError, ZoneInfoNotFoundError) as exc:  # a row no check let through
                if self.broken.get(job.id) != str(exc):
                    self.broken[job.id] = str(exc)
                    self.log.error("cron_job_unusable", job=job.name, schedule=job.schedule, tz=job.tz, error=str(exc))
                continue
            if decision.unrecorded_before is not None:
                self.log.warning("cron_missed_fires_unrecorded", job=job.name, before=decision.unrecorded_before,
                                 note=f"after a long outage only the last {MAX_SKIPPED} missed fires are recorded")
            for times, reason in decision.skips:
                await self._skip(job, times, reason, now)
            if decision.fire is not None and await self._fire(job, decision.fire, now):
                busy[job.id] = decision.fire
            if decision.next_at is not None:
                wake_at = decision.next_at if wake_at is None else min(wake_at, decision.next_at)
        return wake_at, bool(busy)

    def _read(self, query):
        with db.read_tx(self.reader) as conn:
            return query(conn)

    @staticmethod
    def _snapshot(conn) -> tuple[list[cron_store.CronJob], dict[int, float], dict[int, float]]:
        jobs = cron_store.list_enabled(conn)
        last = {job.id: t for job in jobs if (t := cron_store.last_scheduled(conn, job.id)) is not None}
        busy = {run.job_id: run.scheduled_for for run in cron_store.open_runs(conn)}
        return jobs, last, busy

    # ------------------------------------------------------------ writes

    async def _call(self, op: m.WriteOp, key: str | None = None):
        return await asyncio.wait_for(self.rt.client.call(op, key=key), CALL_TIMEOUT_S)

    async def _fire(self, job: cron_store.CronJob, scheduled_for: float, now: float) -> bool:
        key = f"cron-fire:{job.id}:{job.created_at!r}:{scheduled_for!r}"
        try:
            accepted = await self._call(m.CronFire(job_id=job.id, scheduled_for=scheduled_for, started_at=now), key)
        except WriteRejected as exc:  # removed or disabled meanwhile
            if exc.writer_condition:  # a full disk, say: the pass ends and is tried again soon
                raise
            self.log.info("cron_fire_refused", job=job.name, scheduled_for=scheduled_for, error=str(exc))
            return False
        self.log.info("cron_fired", job=job.name, scheduled_for=cron.local_iso(scheduled_for, job.tz),
                      late_s=round(now - scheduled_for, 3), turn_id=accepted.turn_id, agent=job.agent,
                      deliver_to=f"{job.deliver_instance}:{job.deliver_chat}")
        return True

    async def _skip(self, job: cron_store.CronJob, times: tuple[float, ...], reason: str, now: float) -> None:
        for start in range(0, len(times), MAX_SKIPPED):
            chunk = list(times[start:start + MAX_SKIPPED])
            key = f"cron-skip:{job.id}:{job.created_at!r}:{chunk[0]!r}:{chunk[-1]!r}"
            try:
                await self._call(m.CronSkip(job_id=job.id, scheduled_for=chunk, reason=reason, at=now), key)
            except WriteRejected as exc:
                if exc.writer_condition:
                    raise
                self.log.info("cron_skip_refused", job=job.name, error=str(exc))
                return
        self.log.info("cron_skipped", job=job.name, count=len(times), first=cron.local_iso(times[0], job.tz),
                      last=cron.local_iso(times[-1], job.tz), reason=reason)

    async def _end(self, run: cron_store.OpenRun) -> None:
        instance, chat = self.alert_to
        op = m.CronRunEnd(run_id=run.id, max_consecutive_failures=self.cfg.max_consecutive_failures,
                          alert_instance=instance, alert_chat=chat)
        try:
            ended = await self._call(op)
        except WriteRejected as exc:
            if exc.writer_condition:
                raise
            self.log.info("cron_run_end_refused", job=run.job, run_id=run.id, error=str(exc))
            return
        self.log.info("cron_run_ended", job=run.job, run_id=run.id, outcome=ended.outcome, turn_id=run.turn_id,
                      consecutive_failures=ended.consecutive_failures)
        if ended.disabled:
            self.log.warning("cron_job_disabled", job=run.job, consecutive_failures=ended.consecutive_failures,
                             alert_to=":".join(self.alert_to) if instance else "",
                             hint=f"starling cron enable {run.job}")


async def serve(rt: Runtime, clock: Clock | None = None) -> None:
    await Scheduler(rt, clock or Clock()).run()


def main(argv: list[str] | None = None, clock: Clock | None = None) -> int:
    """The scheduler on wall time; a test passes its own ``clock`` (tests/clocked_scheduler.py)."""
    svc = boot("scheduler", argv, description="Starling's cron scheduler")
    return asyncio.run(Runtime(svc).run(lambda rt: serve(rt, clock), announces_ready=True))


if __name__ == "__main__":
    sys.exit(main())
