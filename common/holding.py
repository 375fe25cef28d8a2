"""Waiting out the writer's condition: a full disk, an I/O error, a busy, restarting or silent writer is
not the fault of the request that met it, and never a reason to drop it or to die.

- ``condition(exc)``: the writer could not store it for a reason of its own (common/errors.py
  WRITER_CONDITIONS, no ack in time, an SQLite error of the disk on a reader, a file that cannot be
  written for want of space): hold it and send it again.
- ``refusal(exc)``: the writer judged the request itself (it fails validation, or cannot travel): sent
  again it fails again. Only such a refusal lets a gateway pass an event over (as a dead letter).
- ``call``: a write sent again with backoff while the writer's condition lasts, under one idempotency key
  (a write that did land before its ack was lost is answered, not applied twice).
"""

from __future__ import annotations

import asyncio
import errno

import apsw

from common.errors import REQUEST_REFUSALS, BusTimeout, WriteRejected

FIRST_S = 0.2
MAX_S = 5.0
LOG_EVERY = 20  # a write held long is logged at its first retry, then every LOG_EVERY retries
_DISK_ERRORS = (apsw.FullError, apsw.IOError, apsw.BusyError, apsw.LockedError)
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def condition(exc: BaseException) -> bool:
    if isinstance(exc, WriteRejected):
        return exc.writer_condition
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return True
    return isinstance(exc, (BusTimeout, asyncio.TimeoutError, *_DISK_ERRORS))


def refusal(exc: BaseException) -> bool:
    return isinstance(exc, WriteRejected) and exc.code in REQUEST_REFUSALS


class Backoff:
    """Delays that double from ``first_s`` up to ``max_s``; ``reset`` after a success."""

    def __init__(self, first_s: float | None = None, max_s: float | None = None) -> None:
        self.first_s = FIRST_S if first_s is None else first_s
        self.max_s = MAX_S if max_s is None else max_s
        self.delay = self.first_s

    def next(self) -> float:
        delay = self.delay
        self.delay = min(self.max_s, self.delay * 2)
        return delay

    def reset(self) -> None:
        self.delay = self.first_s


async def call(client, op, *, key: str | None = None, log=None):
    """``client.call(op)`` until it is stored or refused: the writer's condition is waited out (logged at
    the first retry and every LOG_EVERY after). Raises only what is not a condition."""
    key = key or client.new_key()
    backoff = Backoff()
    tries = 0
    while True:
        try:
            result = await client.call(op, key=key)
        except Exception as exc:
            if not condition(exc):
                raise
            tries += 1
            delay = backoff.next()
            if log is not None and (tries == 1 or tries % LOG_EVERY == 0):
                log.warning("write_held", op=type(op).__name__, error=str(exc) or type(exc).__name__, tries=tries,
                            retry_in_s=delay)
            await asyncio.sleep(delay)
            continue
        if tries and log is not None:
            log.info("write_resumed", op=type(op).__name__, tries=tries)
        return result
