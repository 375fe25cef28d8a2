"""Service heartbeats: the last word of each process, for `status` and `/health`."""

from __future__ import annotations

from typing import NamedTuple

import apsw

UPSERT = (
    "INSERT INTO service_beats (service, pid, state, detail, started_at, beat_at, parent_pid)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (service) DO UPDATE SET state = excluded.state, detail = excluded.detail,"
    " beat_at = excluded.beat_at, pid = excluded.pid, parent_pid = excluded.parent_pid,"
    " started_at = CASE WHEN service_beats.pid = excluded.pid THEN service_beats.started_at"
    "                   ELSE excluded.started_at END,"
    " starts = CASE WHEN service_beats.parent_pid != excluded.parent_pid THEN 1"
    "               ELSE service_beats.starts + (service_beats.pid != excluded.pid) END"
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


def record(
    conn: apsw.Connection, service: str, pid: int, state: str, detail: str, now: float, parent_pid: int = 0
) -> None:
    """Upsert a beat; ``starts`` counts new pids under the same parent (a new supervisord starts at 1)."""
    conn.execute(UPSERT, (service, pid, state, detail, now, now, parent_pid))


def all_beats(conn: apsw.Connection) -> list[Beat]:
    return [Beat(*row) for row in conn.execute(ALL)]
