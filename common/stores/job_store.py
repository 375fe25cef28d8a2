"""Background jobs started by agents: their rows (the output is a file under data/jobs/)."""

from __future__ import annotations

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
