"""Every service's warnings and errors into the ``daemon_log`` table: the log's queue (common/log.py) drained
every second or so and sent to the writer in one batch, bounded by ``[retention] audit_days`` and a row cap.

Shipping never fails the service and never logs at warning level itself (that would feed its own queue):
a batch the writer does not take is dropped, counted, and said once at info level.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

import msgspec

from common import log as logging
from common.redact import redact
from schema import messages as m

INTERVAL_S = 1.0
BATCH_MAX = 200  # lines in one request (the writer takes up to 1,000)
MAX_ROWS = 100_000  # the table's bound beside the retention days
CALL_TIMEOUT_S = 10.0
_LEAVE_OUT = ("ts", "level", "service", "event", "pid")
_encoder = msgspec.json.Encoder(enc_hook=str)


def line_of(event: dict, default_service: str) -> m.DaemonLogLine:
    """One queued log event as a row: its time, service, level, event; the rest as JSON (redacted)."""
    try:
        at = datetime.fromisoformat(str(event.get("ts", "")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        at = time.time()
    level = str(event.get("level", "warning"))
    detail = {k: v for k, v in event.items() if k not in _LEAVE_OUT}
    return m.DaemonLogLine(at=at, service=str(event.get("service") or default_service),
                           level="error" if level == "exception" else level,
                           event=str(event.get("event", ""))[:200], detail=redact(_encoder.encode(detail).decode()))


def batch(queue, default_service: str, limit: int = BATCH_MAX) -> list[m.DaemonLogLine]:
    lines = []
    while queue and len(lines) < limit:
        lines.append(line_of(queue.popleft(), default_service))
    return lines


async def ship(client, service: str, retention_days, log, interval_s: float = INTERVAL_S) -> None:
    """Send queued lines until cancelled. ``retention_days()`` says how long rows are kept (read at each
    batch, so a reload applies)."""
    queue = logging.keep_warnings()
    dropped = 0
    while True:
        await asyncio.sleep(interval_s)
        while queue:
            lines = batch(queue, service)
            op = m.RecordDaemonLog(lines=lines, before=time.time() - retention_days() * 86400, max_rows=MAX_ROWS)
            try:
                await asyncio.wait_for(client.call(op), CALL_TIMEOUT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the writer away or refusing: these lines are lost, said once
                if not dropped:
                    log.info("daemon_log_dropped", lines=len(lines), error=str(exc) or type(exc).__name__)
                dropped += len(lines)
                break
            else:
                if dropped:
                    log.info("daemon_log_resumed", dropped=dropped)
                    dropped = 0


class Local:
    """The writer's own warnings and errors: it stores them itself, as requests of its own, every
    INTERVAL_S (``due`` says when)."""

    def __init__(self, service: str, epoch: str) -> None:
        self.queue = logging.keep_warnings()
        self.service = service
        self.epoch = epoch
        self.sent = 0
        self.next_at = 0.0

    def requests(self, now_mono: float, retention_days: float) -> list[m.Request]:
        if now_mono < self.next_at or not self.queue:
            return []
        self.next_at = now_mono + INTERVAL_S
        out = []
        while self.queue:
            self.sent += 1
            op = m.RecordDaemonLog(lines=batch(self.queue, self.service),
                                   before=time.time() - retention_days * 86400, max_rows=MAX_ROWS)
            out.append(m.Request(id=0, key=f"daemon-log:{self.epoch}:{self.sent}", op=op))
        return out
