"""One group commit: a batch of write requests applied in one transaction, and what to ack and publish after it.

Requests that arrive while the batch is applied join it (``more``), up to ``limit``: they would
otherwise wait for the next commit, and one fsync is shared by more of them.

The batch is applied without savepoints first: in the common case every request succeeds and one
transaction holds them all. When one fails (a refusal, a constraint, an error of its own), the whole
transaction is rolled back and the batch applied again from the start with each request in a savepoint,
so the failing one gets its error ack and every other commits, once. Both passes are the same requests
against the same state at the same ``now``, so a request's effects, its answer kept in write_keys and
the first answer returned to its replays are what they would have been had it come alone.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import apsw

from common import bus
from common.stores import db_store, keys_store
from schema import messages as m
from services.writer import apply as ops
from services.writer import inbound_ops

Item = tuple[bytes, m.Request]  # (the client's routing id, its request)

# A request's own failure: it fails alone (any other apsw.Error from COMMIT fails the batch).
# A full disk, an I/O error, a busy database are never one request's: they fail the batch, whose requests
# are answered with the condition's code (services/writer/disk.py) and sent again by their clients.
CONDITIONS = (apsw.FullError, apsw.IOError, apsw.BusyError, apsw.LockedError)
_FAILURES = (ops.Rejected, apsw.Error, ValueError, TypeError, OverflowError)


class Applied(NamedTuple):
    acks: list[tuple[bytes, m.Ack]]
    events: list[ops.Pending]
    retried: bool  # a request failed, so the batch was applied a second time, with savepoints


def commit(conn: apsw.Connection, work: list[Item], now: float, log,
           more: Callable[[int], list[Item]] = lambda room: [], limit: int = 0) -> Applied:
    """Apply ``work`` and commit. While the batch is under ``limit``, ``more(room)`` is asked for
    requests that arrived meanwhile (at most ``room``); they are applied too and appended to ``work``.
    Raises apsw.Error, with the transaction rolled back, when it cannot commit (the disk, the file):
    then nothing of ``work`` is stored."""
    db_store.begin(conn)
    try:
        events: list[ops.Pending] = []
        acks = _apply_all(conn, work, now, events)
        while acks is not None and len(work) < limit:
            joining = more(limit - len(work))
            if not joining:
                break
            work += joining
            done = _apply_all(conn, joining, now, events)
            acks = None if done is None else acks + done
        retried = acks is None
        if retried:
            db_store.rollback(conn)
            db_store.begin(conn)
            events = []
            acks = [(ident, _apply_one(conn, req, now, events, log)) for ident, req in work]
        db_store.commit(conn)
    except apsw.Error:
        db_store.rollback(conn)
        raise
    return Applied(acks, events, retried)


def _apply_all(conn: apsw.Connection, work: list[Item], now: float, events: list[ops.Pending]):
    """Every request in the open transaction, no savepoints; None as soon as one fails (the caller
    rolls the transaction back: what the failing request did in part is in it). Consecutive inbound
    messages are stored together (inbound_ops.store_run)."""
    acks = []
    unrecorded, apply, answer, remember = ops.UNRECORDED, ops.apply, keys_store.answer, keys_store.remember_answer
    at, count = 0, len(work)
    while at < count:
        ident, req = work[at]
        op = req.op
        try:
            if isinstance(op, m.Inbound):
                end = at + 1
                while end < count and isinstance(work[end][1].op, m.Inbound):
                    end += 1
                run = work[at:end]
                results = inbound_ops.store_run(conn, [req.op for _, req in run], now, events)
                acks += [(ident, m.Ack(id=req.id, ok=True, result=result)) for (ident, req), result in zip(run, results)]
                at = end
                continue
            at += 1
            if isinstance(op, unrecorded):
                result = apply(conn, op, now, events)
            else:
                first = answer(conn, req.key)
                if first is not None:
                    acks.append((ident, m.Ack(id=req.id, ok=True, result=bus.result_decoder.decode(first))))
                    continue
                result = apply(conn, op, now, events)
                remember(conn, req.key, bus.encode(result), now)
        except _FAILURES:
            return None
        acks.append((ident, m.Ack(id=req.id, ok=True, result=result)))
    return acks


def _apply_one(conn: apsw.Connection, req: m.Request, now: float, events: list[ops.Pending], log) -> m.Ack:
    """One request in a savepoint of its own: on failure it alone is undone and answered with its error."""
    record = not isinstance(req.op, ops.UNRECORDED)
    if record:
        answer = keys_store.answer(conn, req.key)
        if answer is not None:
            return m.Ack(id=req.id, ok=True, result=bus.result_decoder.decode(answer))
    mark = len(events)
    db_store.savepoint(conn)
    try:
        result = ops.apply(conn, req.op, now, events)
        if record:
            keys_store.remember_answer(conn, req.key, bus.encode(result), now)
        db_store.release(conn)
        return m.Ack(id=req.id, ok=True, result=result)
    except ops.Rejected as exc:
        code, error = exc.code, str(exc)
    except apsw.ConstraintError as exc:
        code, error = "conflict", str(exc)
    except CONDITIONS:  # the disk's or the database's, not this request's: the batch fails (disk_full, ...)
        raise
    except (apsw.Error, ValueError, TypeError, OverflowError) as exc:  # never fatal: this request fails alone
        code, error = "internal", f"{type(exc).__name__}: {exc}"
        log.error("write_failed", op=type(req.op).__name__, error=error)
    db_store.rollback_to(conn)
    del events[mark:]
    return m.Ack(id=req.id, ok=False, code=code, error=error)
