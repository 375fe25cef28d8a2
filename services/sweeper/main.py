"""The sweeper: WAL checkpoints and the health watch, conversation resets, session memory, retention.

Every ``[health] heartbeat_interval_ms`` (a tick), in order:
1. health: a TRUNCATE checkpoint through the writer, then ``common.health.evaluate`` (free disk of
   data_dir, agents_dir and workspace_dir, WAL size, each service's heartbeat). The truncate is asked
   for only when a PASSIVE checkpoint first got every WAL frame back: when a long reader holds old
   frames, a TRUNCATE would make the writer wait on it, so the WAL is left to show as large (and
   /health to say degraded). The result becomes the sweeper's heartbeat detail (`starling status`,
   `/health`). Alerts are raised by control alone, one per change (README "Sweeper").
2. daily or idle resets, then session-memory captures (services/sweeper/memory.py);
3. the retention pass (services/sweeper/retention.py) when due: at start, then every
   ``RETENTION_EVERY_S`` of the sweeper's clock (services/sweeper/clock.py; tests can move it). It
   runs as a task of its own beside the ticks, one pass at a time.
A part that fails is logged and tried again on the next tick (the pass: when next due); it never stops
the others. Reads use one read-only connection, only from this event loop's thread, one short read
transaction at a time (none spans an await).
"""

from __future__ import annotations

import asyncio
import sys
import time

from common import db, health, holding
from common.db import read_tx
from common.runtime import Runtime
from common.service import boot
from common.stores import beat_store
from schema import messages as m
from services.sweeper.clock import Clock
from services.sweeper.memory import Memory
from services.sweeper.retention import Retention

RETENTION_EVERY_S = 3600.0
MIN_PAUSE_S = 0.05


class Sweeper:
    def __init__(self, rt: Runtime, clock: Clock | None = None) -> None:
        self.rt = rt
        self.svc = rt.svc
        self.log = rt.log
        self.clock = clock or Clock()
        self._reader = None
        self.memory = Memory(self.svc, self.call, self.reader, self.log)
        self.retention = Retention(self.svc, self.call, self.reader, self.log, self.memory)
        self.next_retention: float | None = None
        self.sweeping: asyncio.Task | None = None
        self.health_status = ""

    async def call(self, op: m.WriteOp):
        return await self.rt.client.call(op)

    def reader(self):
        if self._reader is None:
            self._reader = db.open_reader(self.svc.paths.db_file)
        return self._reader

    async def run(self) -> None:
        self._reader = await asyncio.to_thread(db.wait_for_schema, self.svc.paths.db_file, 60.0,
                                               stop=self.svc.stopping)
        if self.clock.note:
            self.log.warning("test_clock", detail=self.clock.note)
        await self.rt.announce_ready()
        interval = self.svc.cfg.health.heartbeat_interval_ms / 1000
        try:
            while True:
                started = time.monotonic()
                await self.tick()
                await asyncio.sleep(max(MIN_PAUSE_S, interval - (time.monotonic() - started)))
        finally:
            if self.sweeping is not None:
                self.sweeping.cancel()

    async def tick(self) -> None:
        await self._guard("health", self.check_health)
        now = self.clock.now()
        await self._guard("reset", self.memory.reset, now)
        await self._guard("capture", self.memory.capture, now)
        due = self.next_retention
        idle = self.sweeping is None or self.sweeping.done()
        if idle and (due is None or now >= due or now < due - RETENTION_EVERY_S):  # (the last: the clock went back)
            self.next_retention = now + RETENTION_EVERY_S
            # beside the ticks: a long first pass (months of backlog) does not hold up health and resets
            self.sweeping = asyncio.create_task(self._guard("retention", self.retention.sweep, now))

    async def _guard(self, part: str, work, *args) -> None:
        try:
            await work(*args)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one part's failure must not stop the others
            if holding.condition(exc):  # a full disk, a writer away: waited out, tried again on the next tick
                self.log.warning("sweep_held", part=part, error=str(exc) or type(exc).__name__)
                return
            self.log.error("sweep_failed", part=part, error=str(exc) or repr(exc), kind=type(exc).__name__,
                           exc_info=True)
            self._reader = None  # a broken read connection is opened again next time

    async def check_health(self) -> dict:
        passive = await self.call(m.Checkpoint(mode="passive"))
        held = passive.checkpointed_pages < passive.wal_pages
        if not held:
            await self.call(m.Checkpoint(mode="truncate"))
        with read_tx(self.reader()) as conn:
            beats = beat_store.all_beats(conn)
        report = health.evaluate(self.svc.paths, self.svc.cfg, beats)
        status, problems = report["status"], health.problems(report)
        wal_mb = report["checks"]["wal"]["bytes"] / 2**20
        detail = f"health {status}; WAL {wal_mb:.1f} MB" + (" (a reader holds old frames)" if held else "")
        if problems:
            detail += ": " + "; ".join(problems)
        if self.retention.held:
            detail = f"retention held (the clock jumped ahead: `starling retention confirm-clock`); {detail}"
        self.rt.detail = detail[:300]
        if status != self.health_status:  # a note for the sweeper's own log; the alert is control's
            self.log.info("health_checked", status=status, problems=problems, wal_bytes=report["checks"]["wal"]["bytes"],
                          wal_held=held)
            self.health_status = status
        return report


async def serve(rt: Runtime, clock: Clock | None = None) -> None:
    await Sweeper(rt, clock).run()


def main(argv: list[str] | None = None, clock: Clock | None = None) -> int:
    """The sweeper on wall time; a test passes its own ``clock`` (tests/clocked_sweeper.py)."""
    svc = boot("sweeper", argv, description="Starling's sweeper: retention, session memory, WAL and disk health")
    return asyncio.run(Runtime(svc).run(lambda rt: serve(rt, clock), announces_ready=True))


if __name__ == "__main__":
    sys.exit(main())
