"""The writer's lease clock: the one time leases, retry times and workers' signs of life are judged on,
monotonic within a writer's life and carried across its restarts; and the watch on the wall clock that
holds retention after a jump forward.

Why not the wall clock: a jump forward of a day expires every lease at once (a tool with side effects
runs twice), a jump back keeps dead leases alive for a day. Why not ``time.monotonic`` alone: it starts
anywhere at each boot, so a lease written by the writer before a restart would mean nothing. So:

- The lease clock reads ``boot_base + CLOCK_BOOTTIME`` (seconds since the host booted, suspend included;
  no change of the wall clock moves it). ``boot_base`` is fixed for one host boot and kept in the database
  with the host's boot id (table lease_clock), so a writer restarted on the same host boot carries on
  exactly: the time it was down counts, and the leases its predecessor wrote keep their meaning.
- The first start ever picks ``boot_base`` so that the lease clock reads the wall time: rows written on
  the wall clock before (lease_until, not_before) keep their meaning.
- On a new host boot (a reboot, or the file moved to another machine) how long the host was off cannot
  be measured. The lease clock goes on from its last persisted reading plus the wall clock's gap since
  then, never less: a wall clock that went back is not followed. Every lease holder died with the host,
  and their successors take back what they held at once (services/writer/lease_ops.py). A gap of more
  than a day cannot be told from a clock that jumped, so it counts as a jump for retention (below).
- The reading is persisted every PERSIST_EVERY_S, at once when the skew moves, and at stop.

Retention: ``skew = wall - lease``. On one host boot it moves only when the wall clock is set (an NTP
step, an operator, a bad RTC). While it is more than a day past the skew the operator accepted,
retention holds: the writer refuses purges (retention_ops.check_clock), the sweeper skips its pass and
says so, the writer logs ``clock_jumped`` (again every hour) and alerts ``[health] alert_to`` once, until
`starling retention confirm-clock` (``ConfirmClock``) accepts the clock as it is.

The seam: the writer makes one LeaseClock at start and ``install``s it; each commit's ``now`` comes from
``stamp()`` (wall time), and ``lease_of(now)`` is the lease clock's reading at that same instant, the
same for both passes of a group commit. Tests make a LeaseClock with fake wall and boottime sources and
install it; with none installed, ``lease_of(now)`` is ``now`` (store-level tests).
"""

from __future__ import annotations

import time
from typing import Callable

import apsw

from common import identity
from common.stores import db_store, outbox_store
from common.stores import lease_clock_store as store
from common.stores.lease_clock_store import DAY_S, State, held_text
from schema import messages as m

PERSIST_EVERY_S = 60.0
SKEW_STEP_S = 1.0  # a skew that moved this much since persisted is persisted (and judged) at once
MOVED_LOG_S = 60.0  # a wall clock step this large is logged
HELD_LOG_EVERY_S = 3600.0

Source = Callable[[], float]


class LeaseClock:
    def __init__(self, state: State, wall: Source = time.time, boottime: Source = identity.boottime, log=None,
                 alert_to: str = "") -> None:
        self._wall = wall
        self._boottime = boottime
        self.log = log
        self.alert_to = alert_to  # "instance:chat" told once when retention starts to hold
        self.base = state.boot_base
        self.boot_id = state.boot_id
        self._state = state  # as chosen at boot: written whole at the first persist when boot could not
        self._saved = True
        self._skew = state.skew  # wall - lease at the last stamp
        self._persisted_skew = state.skew
        self._next_persist = 0.0
        self._next_held_log = 0.0
        self.held = False  # whether retention holds, as last judged
        self.jump = state.jump_s  # the unconfirmed jump forward, as last judged

    @classmethod
    def boot(cls, conn: apsw.Connection, wall: Source = time.time, boottime: Source = identity.boottime,
             host_boot: Callable[[], str] = identity.host_boot_id, log=None, alert_to: str = "") -> LeaseClock:
        """Read the persisted clock, carry it on (same host boot) or on from its last reading (a new one)."""
        row = store.get(conn)
        now, since_boot, boot_id = wall(), boottime(), host_boot()
        if row is None:
            how, base, confirmed = "first_start", now - since_boot, 0.0
        elif boot_id and row.boot_id == boot_id:
            how, base, confirmed = "same_host_boot", row.boot_base, row.confirmed_skew
        else:
            gap = max(0.0, now - row.last_wall)
            how, base = "new_host_boot", row.last_lease + gap - since_boot
            confirmed = row.confirmed_skew - (gap if gap > DAY_S else 0.0)  # unmeasurable: a jump until confirmed
        lease = base + since_boot
        state = State(boot_id, base, lease, now, now - lease, confirmed, now)
        clock = cls(state, wall, boottime, log, alert_to)
        db_store.begin(conn)
        try:
            store.put(conn, state)
            db_store.commit(conn)
        except apsw.Error as exc:  # a full disk: the clock runs, and is written at the first tick that can
            db_store.rollback(conn)
            clock._saved = False
            if log is not None:
                log.warning("lease_clock_not_persisted", error=str(exc))
        if log is not None:
            log.info("lease_clock", start=how, lease=round(lease, 3), skew_s=round(state.skew, 3),
                     unconfirmed_jump_s=round(state.jump_s, 3))
        return clock

    def lease(self) -> float:
        return self.base + self._boottime()

    def stamp(self) -> float:
        """The wall time of a commit, remembering the lease clock's reading of the same instant."""
        now, lease = self._wall(), self.lease()
        self._skew = now - lease
        return now

    def lease_at(self, now: float) -> float:
        """The lease clock's reading at wall time ``now`` (as of the last stamp)."""
        return now - self._skew

    @property
    def skew(self) -> float:
        return self._skew

    def persist_soon(self) -> None:
        self._next_persist = 0.0

    def on_timer(self, conn: apsw.Connection, now_mono: float) -> list:
        """Between batches: persist the reading when due or when the skew moved, judge the jump, log and
        alert. Returns the events to publish (an alert's outbox row). Never raises for the database."""
        now = self.stamp()
        if abs(self._skew - self._persisted_skew) < SKEW_STEP_S and now_mono < self._next_persist:
            if self.held and now_mono >= self._next_held_log:
                self._log_held(self.jump, now_mono)
            return []
        events: list = []
        db_store.begin(conn)
        try:
            self._write(conn, now)
            row = store.get(conn)
            jump = self._skew - row.confirmed_skew
            held = jump > DAY_S
            if held and not self.held:
                self._alert(conn, jump, now, events)
            db_store.commit(conn)
            self._saved = True
        except apsw.Error as exc:  # a full disk, say: tried again at the next tick
            db_store.rollback(conn)
            if self.log is not None:
                self.log.warning("lease_clock_not_persisted", error=str(exc))
            self._next_persist = now_mono + SKEW_STEP_S
            return []
        moved = self._skew - self._persisted_skew
        self._persisted_skew = self._skew
        self._next_persist = now_mono + PERSIST_EVERY_S
        self.jump = jump
        if self.log is not None and abs(moved) >= MOVED_LOG_S:
            self.log.warning("clock_moved", by_s=round(moved, 3), note="leases stay on the lease clock")
        if held and (not self.held or now_mono >= self._next_held_log):
            self._log_held(jump, now_mono)
        elif self.held and not held and self.log is not None:
            self.log.info("clock_accepted", unconfirmed_jump_s=round(jump, 3), note="retention runs again")
        self.held = held
        return events

    def _log_held(self, jump: float, now_mono: float) -> None:
        self._next_held_log = now_mono + HELD_LOG_EVERY_S
        if self.log is not None:
            self.log.warning("clock_jumped", ahead_s=round(jump, 3), detail=held_text(jump))

    def _alert(self, conn: apsw.Connection, jump: float, now: float, events: list) -> None:
        instance, _, chat = self.alert_to.partition(":")
        if not (instance and chat):
            return
        outbox_id = outbox_store.enqueue(conn, None, None, instance, chat, f"Starling: {held_text(jump)}", "", "", now)
        events.append((m.topic_outbox(instance), m.OutboxPending,
                       {"instance": instance, "chat": chat, "outbox_id": outbox_id}))

    def _write(self, conn: apsw.Connection, now: float) -> None:
        if not self._saved:
            store.put(conn, self._state)
        store.reading(conn, self.boot_id, self.base, now - self._skew, now, self._state.confirmed_skew)

    def persist(self, conn: apsw.Connection) -> None:
        """At stop: the last reading, for a writer that starts on a new host boot."""
        now = self.stamp()
        db_store.begin(conn)
        try:
            self._write(conn, now)
            db_store.commit(conn)
            self._saved = True
        except apsw.Error:
            db_store.rollback(conn)


_installed: LeaseClock | None = None


def install(clock: LeaseClock | None) -> None:
    """Make ``clock`` the one leases are judged on (the writer, at start; tests)."""
    global _installed
    _installed = clock


def installed() -> LeaseClock | None:
    return _installed


def lease_of(now: float) -> float:
    """The lease clock's reading at a commit's ``now`` (``now`` itself when no clock is installed)."""
    return now if _installed is None else _installed.lease_at(now)
