"""Retention per ``[retention]``: rows through the writer in bounded steps, then the files that went with them.

One pass, in this order (files always after the rows that name them are committed):
1. conversations last active more than ``session_days`` ago (``PurgeSessions`` steps), with their
   turns, delivered messages, tool audit and approvals; after each step's ack, the attachments of the
   deleted turns; then day folders ``data/attachments/<agent>/<date>/`` older than the window that no
   remaining conversation of that agent can refer to (it began more than a day after them);
2. audit rows and tool executions older than ``audit_days`` (``PurgeAudit``);
3. background jobs that ended more than ``job_log_days`` ago (``PurgeJobs``), then their logs; then any
   other file in ``data/jobs/`` untouched for as long that no job row names (a running job's row
   always names its log, so it is never removed);
4. files in ``data/tool-output/<session>/`` untouched for ``tool_output_days``;
5. files in each ``workspace/private/<id>/.scratchpad/`` untouched for ``scratchpad_days``;
6. session-memory captures older than ``[session_memory] retention_days``.
Empty folders left behind go too. The pass ends with one ``retention_swept`` log line: rows deleted per
table, files and bytes freed per kind, steps, the longest step inside the writer, seconds.
"""

from __future__ import annotations

import asyncio
import calendar
import os
import time
from collections import Counter
from dataclasses import dataclass, field

from common.db import read_tx
from common.stores import lease_clock_store, retention_store
from schema import messages as m
from services.sweeper import files
from services.sweeper.files import Freed

DAY_S = 86400.0
STEP_MAX_MS = 15.0  # a purge step's time inside the writer's transaction (chat writes in its batch wait for it)
STEP_PAUSE_S = 0.005  # between two steps: the writes that queued during one commit without the next
STUCK_STEPS = 3  # steps in a row that say "more" but delete nothing: give up until the next pass


@dataclass
class Report:
    rows: Counter = field(default_factory=Counter)
    freed: dict[str, Freed] = field(default_factory=dict)
    steps: int = 0
    longest_step_ms: float = 0.0

    def free(self, kind: str, freed: Freed) -> None:
        self.freed.setdefault(kind, Freed()).add(freed)


class Retention:
    def __init__(self, svc, call, reader, log, memory) -> None:
        self.svc = svc
        self.paths = svc.paths
        self.call = call
        self.reader = reader
        self.log = log
        self.memory = memory
        self.stop = svc.stopping
        self.held = ""  # why the last pass was held ("" when it ran)

    @property
    def cfg(self):
        """[retention], read at each use: `starling reload` changes it in place (SIGHUP)."""
        return self.svc.cfg.retention

    async def sweep(self, now: float) -> Report:
        started = time.monotonic()
        report = Report()
        self.held = self._clock_hold()
        if self.held:  # the wall clock jumped ahead: nothing goes by age until an operator confirms it
            self.log.warning("retention_held", detail=self.held)
            return report
        await self._sessions(now - self.cfg.session_days * DAY_S, report)
        await self._steps(lambda: m.PurgeAudit(before=now - self.cfg.audit_days * DAY_S, max_ms=STEP_MAX_MS), report, None)
        await self._jobs(now - self.cfg.job_log_days * DAY_S, report)
        report.free("tool_output", await asyncio.to_thread(
            files.prune_tree, self.paths.tool_output_dir, now - self.cfg.tool_output_days * DAY_S, self.stop))
        report.free("scratchpad", await asyncio.to_thread(self._scratchpads, now - self.cfg.scratchpad_days * DAY_S))
        count, size = await asyncio.to_thread(self.memory.expire, now, self.stop)
        report.free("captures", Freed(files=count, bytes=size))
        self.log.info(
            "retention_swept", rows=dict(report.rows),
            files={kind: f.files for kind, f in report.freed.items()},
            bytes_freed=sum(f.bytes for f in report.freed.values()),
            folders_removed=sum(f.folders for f in report.freed.values()),
            steps=report.steps, longest_step_ms=report.longest_step_ms,
            seconds=round(time.monotonic() - started, 3),
        )
        return report

    def _clock_hold(self) -> str:
        """Why retention must wait (services/writer/lease_clock.py: the writer's lease clock against the
        wall clock), or "" when it may run. The writer refuses the purges too; the files are ours to spare."""
        with read_tx(self.reader()) as conn:
            state = lease_clock_store.get(conn)
        return lease_clock_store.held_text(state.jump_s) if state is not None and state.holds_retention else ""

    async def _steps(self, make_op, report: Report, after_step) -> None:
        """Send purge steps until one says there is no more; ``after_step(purged)`` runs after each ack."""
        idle = 0
        while True:
            purged = await self.call(make_op())
            report.steps += 1
            report.longest_step_ms = max(report.longest_step_ms, purged.ms)
            report.rows.update(purged.rows)
            if after_step is not None:
                await after_step(purged)
            if not purged.more:
                return
            idle = idle + 1 if not purged.rows else 0
            if idle >= STUCK_STEPS:
                self.log.warning("retention_stalled", op=type(make_op()).__name__, steps=report.steps)
                return
            await asyncio.sleep(STEP_PAUSE_S)

    # ------------------------------------------------------------ conversations and attachments

    def _remove_named(self, report: Report, kind: str, folder):
        """After a committed step: remove the files its deleted rows named (only inside ``folder``)."""
        async def remove(purged: m.Purged) -> None:
            if purged.files:
                report.free(kind, await asyncio.to_thread(files.remove_files, purged.files, folder, self.stop))
        return remove

    async def _sessions(self, before: float, report: Report) -> None:
        await self._steps(lambda: m.PurgeSessions(before=before, max_ms=STEP_MAX_MS), report,
                          self._remove_named(report, "attachments", self.paths.attachments_dir))
        with read_tx(self.reader()) as conn:
            oldest = retention_store.oldest_session_by_agent(conn)
        report.free("attachments", await asyncio.to_thread(self._stale_days, before, oldest))

    def _stale_days(self, before: float, oldest: dict[str, float]) -> Freed:
        """Day folders (UTC dates, as gateways name them) older than the window by a day, of agents whose
        oldest remaining conversation began more than a day after them: no turn can name their files."""
        freed = Freed()
        root = self.paths.attachments_dir
        try:
            agents = [e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return freed
        for agent in agents:
            try:
                days = [e.name for e in os.scandir(root / agent) if e.is_dir(follow_symlinks=False)]
            except OSError:
                continue
            for day in days:
                try:
                    day_end = calendar.timegm(time.strptime(day, "%Y-%m-%d")) + DAY_S
                except ValueError:
                    continue  # not a day folder: not ours
                if day_end + DAY_S <= before and day_end + DAY_S <= oldest.get(agent, float("inf")):
                    freed.add(files.remove_tree(root, agent, day))
                if self.stop.is_set():
                    return freed
        return freed

    # ------------------------------------------------------------ jobs

    async def _jobs(self, before: float, report: Report) -> None:
        await self._steps(lambda: m.PurgeJobs(before=before, max_ms=STEP_MAX_MS), report,
                          self._remove_named(report, "job_logs", self.paths.jobs_dir))
        with read_tx(self.reader()) as conn:
            named = {os.path.realpath(p) for p in retention_store.job_log_paths(conn)}
        # logs no row names (a job whose start was never recorded), untouched for the window
        report.free("job_logs", await asyncio.to_thread(
            files.prune_tree, self.paths.jobs_dir, before, self.stop, keep=lambda path: os.path.realpath(path) in named))

    # ------------------------------------------------------------ scratchpads

    def _scratchpads(self, cutoff: float) -> Freed:
        freed = Freed()
        root = self.paths.private_root
        try:
            agents = [e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
        except OSError:
            return freed
        for agent in agents:
            if self.stop.is_set():
                break
            freed.add(files.prune_tree(root, cutoff, self.stop, agent, ".scratchpad"))
        return freed
