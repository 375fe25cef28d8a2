"""Background jobs started by agents: their rows (the output is a file under data/jobs/)."""

from __future__ import annotations

from typing import NamedTuple

import apsw

START = (
    "INSERT INTO jobs (session_id, agent, command, state, pid, log_path, started_at)"
    " VALUES (?, ?, ?, 'running', ?, ?, ?)"
)
END = "UPDATE jobs SET state = ?, exit_code = ?, ended_at = ? WHERE id = ? AND state = 'running'"


def start(conn: apsw.Connection, session_id: int | None, agent: str, command: str, pid: int, log_path: str,
          now: float) -> int:
    conn.execute(START, (session_id, agent, command, pid, log_path, now))
    return conn.last_insert_rowid()


def end(conn: apsw.Connection, job_id: int, state: str, exit_code: int, now: float) -> bool:
    conn.execute(END, (state, exit_code, now, job_id))
    return conn.changes() > 0


# ---------------------------------------------------------------- reads (the runner's job_status)

GET = (
    "SELECT id, session_id, agent, command, state, pid, log_path, exit_code, started_at, ended_at"
    " FROM jobs WHERE id = ?"
)
LIST_FOR_AGENT = (
    "SELECT id, session_id, agent, command, state, pid, log_path, exit_code, started_at, ended_at"
    " FROM jobs WHERE agent = ? ORDER BY id DESC LIMIT ?"
)


class Job(NamedTuple):
    id: int
    session_id: int | None
    agent: str
    command: str
    state: str
    pid: int | None
    log_path: str
    exit_code: int | None
    started_at: float
    ended_at: float | None


def get(conn: apsw.Connection, job_id: int) -> Job | None:
    row = conn.execute(GET, (job_id,)).fetchone()
    return Job(*row) if row is not None else None


def list_for_agent(conn: apsw.Connection, agent: str, limit: int = 20) -> list[Job]:
    """An agent's most recent jobs, newest first."""
    return [Job(*row) for row in conn.execute(LIST_FOR_AGENT, (agent, limit))]
