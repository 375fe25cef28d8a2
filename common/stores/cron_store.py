"""Cron jobs and their runs: the rows the scheduler fires."""

from __future__ import annotations

from typing import NamedTuple

import apsw

ADD = (
    "INSERT INTO cron_jobs (name, schedule, tz, run_at, prompt, agent, deliver_instance, deliver_chat,"
    " created_at, updated_at, created_by) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
REMOVE = "DELETE FROM cron_jobs WHERE name = ?"


def add(
    conn: apsw.Connection, name: str, schedule: str, tz: str, run_at: float | None, prompt: str, agent: str,
    deliver_instance: str, deliver_chat: str, created_by: str, now: float,
) -> int:
    """A new job; a taken name raises apsw.ConstraintError (names are UNIQUE)."""
    conn.execute(ADD, (name, schedule, tz, run_at, prompt, agent, deliver_instance, deliver_chat, now, now,
                       created_by))
    return conn.last_insert_rowid()


def remove(conn: apsw.Connection, name: str) -> bool:
    conn.execute(REMOVE, (name,))
    return conn.changes() > 0


# ---------------------------------------------------------------- reads (the runner's cron tools)

_COLUMNS = (
    "id, name, schedule, tz, run_at, prompt, agent, deliver_instance, deliver_chat, enabled, created_at, created_by"
)
GET_BY_NAME = "SELECT " + _COLUMNS + " FROM cron_jobs WHERE name = ?"
LIST_FOR_AGENT = "SELECT " + _COLUMNS + " FROM cron_jobs WHERE agent = ? ORDER BY name"


class CronJob(NamedTuple):
    id: int
    name: str
    schedule: str
    tz: str
    run_at: float | None
    prompt: str
    agent: str
    deliver_instance: str
    deliver_chat: str
    enabled: int
    created_at: float
    created_by: str


def get_by_name(conn: apsw.Connection, name: str) -> CronJob | None:
    row = conn.execute(GET_BY_NAME, (name,)).fetchone()
    return CronJob(*row) if row is not None else None


def list_for_agent(conn: apsw.Connection, agent: str) -> list[CronJob]:
    return [CronJob(*row) for row in conn.execute(LIST_FOR_AGENT, (agent,))]
