"""The sweeper's writes as the writer applies them: retention deletes in bounded steps, resets, capture marks.

A purge step runs inside the writer's group commit like any write, so it is kept short: it deletes
in chunks of at most ``CHUNK`` rows and stops between chunks once it has spent ``max_rows`` rows or
``max_ms`` milliseconds, answering ``more=True``; the sweeper sends the next step. Chats keep flowing
between steps. Files are never touched here: the answer names them and the sweeper removes them
after the commit (files go after their rows).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from typing import Callable

import msgspec

from common.stores import audit_store, lease_clock_store, retention_store, session_store
from schema import messages as m
from services.writer import apply as _apply  # for Rejected (apply imports this module: looked up at call time)
from services.writer import lease_clock

CHUNK = 512  # at most this many rows per DELETE statement: the unit between two looks at the clock
FIRST_CHUNK = 32  # the first chunk of a step, before the cost of a row is known
MIN_CHUNK = 8
CANDIDATES = 32  # conversations fetched per look
MAX_STEP_MS = 1000.0
RESET_REASONS = ("daily", "idle")

_attachments = msgspec.json.Decoder(list[str])


class _Budget:
    """What one step may still spend: rows, and time inside the transaction. Chunks are sized from the
    cost of the rows deleted so far, so that the last one ends near the deadline rather than past it
    (a turn costs far more than an inbound key: recall index, referring rows)."""

    def __init__(self, max_rows: int, max_ms: float) -> None:
        if max_rows < 1:
            raise _apply.Rejected("invalid", f"max_rows must be 1 or more, not {max_rows}")
        if not 0 < max_ms <= MAX_STEP_MS:  # also refuses NaN
            raise _apply.Rejected("invalid", f"max_ms must be in (0, {MAX_STEP_MS:g}], not {max_ms}")
        self.rows_left = max_rows
        self.started = time.perf_counter()
        self.deadline = self.started + max_ms / 1000
        self.row_s: dict[str, float] = {}  # per kind of row, the latest cost of one

    def chunk(self, key: str) -> int:
        row_s = self.row_s.get(key)
        if row_s:
            size = max(MIN_CHUNK, min(CHUNK, int((self.deadline - time.perf_counter()) / row_s)))
        else:
            size = FIRST_CHUNK
        return max(1, min(size, self.rows_left))

    def spend(self, rows: int, key: str = "", seconds: float = 0.0) -> None:
        self.rows_left -= rows
        if rows >= MIN_CHUNK:
            self.row_s[key] = seconds / rows

    def spent(self) -> bool:
        return self.rows_left <= 0 or time.perf_counter() >= self.deadline

    def ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 3)


def _check_before(before: float) -> None:
    if not math.isfinite(before):
        raise _apply.Rejected("invalid", f"before must be a time, not {before}")


def _drain(budget: _Budget, rows: Counter, key: str, delete: Callable[[int], int]) -> bool:
    """Run ``delete(limit)`` chunk after chunk: True once nothing is left, False when the budget ran out first."""
    while True:
        limit = budget.chunk(key)
        started = time.perf_counter()
        deleted = delete(limit)
        if deleted:
            rows[key] += deleted
        budget.spend(deleted, key, time.perf_counter() - started)
        if deleted < limit:
            return True
        if budget.spent():
            return False


def _purge_session(conn, session_id: int, budget: _Budget, rows: Counter, files: list[str]) -> bool:
    """Delete one conversation, children first; False when the budget ran out (the next step goes on)."""

    def turns(limit: int) -> int:
        deleted, attachment_lists = retention_store.delete_turn_chunk(conn, session_id, limit)
        for raw in attachment_lists:
            try:
                files.extend(_attachments.decode(raw))
            except msgspec.DecodeError:
                pass  # not a list of paths: nothing to remove
        return deleted

    # delivered messages first: the turn deletes then find no outbox row to set to NULL
    steps = (
        ("outbox", lambda limit: retention_store.delete_session_outbox(conn, session_id, limit)),
        ("turns", turns),
        ("tool_executions", lambda limit: retention_store.delete_session_tools(conn, session_id, limit)),
        ("approvals", lambda limit: retention_store.delete_session_approvals(conn, session_id, limit)),
    )
    for key, delete in steps:
        if not _drain(budget, rows, key, delete):
            return False
    rows["sessions"] += retention_store.delete_session(conn, session_id)
    budget.spend(1)
    return True


def purge_sessions(conn, op: m.PurgeSessions) -> m.Purged:
    _check_before(op.before)
    budget = _Budget(op.max_rows, op.max_ms)
    rows: Counter = Counter()
    files: list[str] = []
    more = False
    while not more:
        ids = retention_store.sessions_past(conn, op.before, CANDIDATES)
        for session_id in ids:
            if budget.spent() or not _purge_session(conn, session_id, budget, rows, files):
                more = True
                break
        if len(ids) < CANDIDATES:
            break
    if not more:
        more = not (_drain(budget, rows, "outbox", lambda n: retention_store.delete_old_outbox(conn, op.before, n))
                    and _drain(budget, rows, "inbound_keys",
                               lambda n: retention_store.delete_old_inbound_keys(conn, op.before, n)))
    return m.Purged(rows=dict(rows), files=files, more=more, ms=budget.ms())


def purge_audit(conn, op: m.PurgeAudit) -> m.Purged:
    _check_before(op.before)
    budget = _Budget(op.max_rows, op.max_ms)
    rows: Counter = Counter()
    done = (_drain(budget, rows, "audit", lambda n: retention_store.delete_old_audit(conn, op.before, n))
            and _drain(budget, rows, "tool_executions", lambda n: retention_store.delete_old_tools(conn, op.before, n))
            and _drain(budget, rows, "cron_runs", lambda n: retention_store.delete_old_cron_runs(conn, op.before, n)))
    return m.Purged(rows=dict(rows), more=not done, ms=budget.ms())


def purge_jobs(conn, op: m.PurgeJobs) -> m.Purged:
    _check_before(op.before)
    budget = _Budget(op.max_rows, op.max_ms)
    rows: Counter = Counter()
    files: list[str] = []
    more = False
    while not budget.spent():
        limit = budget.chunk("jobs")
        jobs = retention_store.jobs_past(conn, op.before, limit)
        for job_id, log_path in jobs:
            if retention_store.delete_job(conn, job_id):
                rows["jobs"] += 1
                files.append(log_path)
        budget.spend(len(jobs))
        more = len(jobs) == limit
        if not more:
            break
    return m.Purged(rows=dict(rows), files=files, more=more, ms=budget.ms())


def check_clock(conn, now: float) -> None:
    """Purges wait while the wall clock stands more than a day ahead of the writer's lease clock, until an
    operator confirms it (services/writer/lease_clock.py): a clock set a year ahead must not delete a year."""
    state = lease_clock_store.get(conn)
    if state is None:
        return
    jump = (now - lease_clock.lease_of(now)) - state.confirmed_skew
    if jump > lease_clock_store.DAY_S:
        raise _apply.Rejected("conflict", f"retention is held: {lease_clock_store.held_text(jump)}")


def confirm_clock(conn, op: m.ConfirmClock, now: float) -> m.ClockConfirmed:
    """Accept the wall clock as it stands: its skew against the lease clock becomes the confirmed one."""
    state = lease_clock_store.get(conn)
    if state is None:
        raise _apply.Rejected("not_found", "the writer has no lease clock yet")
    skew = now - lease_clock.lease_of(now)
    jump = skew - state.confirmed_skew
    lease_clock_store.confirm(conn, skew, now)
    audit_store.record_event(conn, now, op.by or "unknown", "clock_confirmed", "lease_clock",
                             json.dumps({"jump_s": round(jump, 3), "skew_s": round(skew, 3)}))
    clock = lease_clock.installed()
    if clock is not None:
        clock.persist_soon()  # judged again (and logged) at the writer's next tick
    return m.ClockConfirmed(jump_s=jump, held=jump > lease_clock_store.DAY_S)


def reset_session(conn, op: m.ResetSession, now: float) -> m.Done:
    if op.reason not in RESET_REASONS:
        raise _apply.Rejected("invalid", f"reason must be one of {', '.join(RESET_REASONS)}, not {op.reason!r}")
    if session_store.get(conn, op.session_id) is None:
        raise _apply.Rejected("not_found", f"session {op.session_id} does not exist")
    if not retention_store.resettable(conn, op.session_id, op.last_active_at):
        raise _apply.Rejected("conflict", f"session {op.session_id} is closed, in use, or was active since")
    session_store.close(conn, op.session_id, op.reason, now)
    return m.Done()


def mark_captured(conn, op: m.MarkCaptured, now: float) -> m.Done:
    for session_id in op.session_ids:
        retention_store.mark_captured(conn, session_id, now)
    return m.Done()
