"""Cron jobs and their runs: the rows the scheduler fires."""

from __future__ import annotations

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
