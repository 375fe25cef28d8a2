"""Service heartbeats: the last word of each process, for `status` and `/health`."""

from __future__ import annotations

from typing import NamedTuple

import apsw

UPSERT = (
    "INSERT INTO service_beats (service, pid, state, detail, started_at, beat_at) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (service) DO UPDATE SET state = excluded.state, detail = excluded.detail,"
    " beat_at = excluded.beat_at, pid = excluded.pid,"
    " started_at = CASE WHEN service_beats.pid = excluded.pid THEN service_beats.started_at"
    "                   ELSE excluded.started_at END,"
    " starts = service_beats.starts + (service_beats.pid != excluded.pid)"
)
ALL = "SELECT service, pid, state, detail, started_at, beat_at, starts FROM service_beats ORDER BY service"


class Beat(NamedTuple):
    service: str
    pid: int
    state: str
    detail: str
    started_at: float
    beat_at: float
    starts: int  # restarts + 1


def record(conn: apsw.Connection, service: str, pid: int, state: str, detail: str, now: float) -> None:
    conn.execute(UPSERT, (service, pid, state, detail, now, now))


def all_beats(conn: apsw.Connection) -> list[Beat]:
    return [Beat(*row) for row in conn.execute(ALL)]
