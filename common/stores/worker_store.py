"""Worker identities: the process now running under each name, and its last sign of life."""

from __future__ import annotations

from typing import NamedTuple

import apsw

GET = "SELECT name, worker, pid, pid_start, host, pid_scope, since, seen, state FROM workers WHERE name = ?"
ALL = "SELECT name, worker, pid, pid_start, host, pid_scope, since, seen, state FROM workers ORDER BY name"
OF_WORKER = (
    "SELECT name, worker, pid, pid_start, host, pid_scope, since, seen, state FROM workers WHERE worker = ?"
)
PUT = (
    "INSERT INTO workers (name, worker, pid, pid_start, host, pid_scope, since, seen, state)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'running')"
    " ON CONFLICT (name) DO UPDATE SET worker = excluded.worker, pid = excluded.pid,"
    " pid_start = excluded.pid_start, host = excluded.host, pid_scope = excluded.pid_scope,"
    " since = excluded.since, seen = excluded.seen, state = 'running'"
)
SEEN = "UPDATE workers SET seen = ?, state = ? WHERE name = ? AND worker = ?"


class Worker(NamedTuple):
    name: str
    worker: str
    pid: int
    pid_start: int
    host: str
    pid_scope: str
    since: float  # wall clock: when it enlisted
    seen: float  # the writer's lease clock: its last beat or enlistment
    state: str  # running | stopped (it said so as it stopped)


def get(conn: apsw.Connection, name: str) -> Worker | None:
    row = conn.execute(GET, (name,)).fetchone()
    return None if row is None else Worker(*row)


def of_worker(conn: apsw.Connection, worker: str) -> Worker | None:
    """The record of a worker id, while it is still the one under its name."""
    row = conn.execute(OF_WORKER, (worker,)).fetchone()
    return None if row is None else Worker(*row)


def all_workers(conn: apsw.Connection) -> list[Worker]:
    return [Worker(*row) for row in conn.execute(ALL)]


def put(conn: apsw.Connection, name: str, worker: str, pid: int, pid_start: int, host: str, pid_scope: str,
        since: float, seen: float) -> None:
    conn.execute(PUT, (name, worker, pid, pid_start, host, pid_scope, since, seen))


def seen(conn: apsw.Connection, name: str, worker: str, at: float, state: str) -> bool:
    """Record a sign of life; False when ``worker`` is no longer the one under ``name`` (superseded)."""
    conn.execute(SEEN, (at, state, name, worker))
    return conn.changes() > 0
