"""Cron jobs and their runs: the rows the scheduler fires, and what the CLI and the agent's tools show."""

from __future__ import annotations

from typing import NamedTuple

import apsw

# ---------------------------------------------------------------- jobs

ADD = (
    "INSERT INTO cron_jobs (name, schedule, tz, run_at, prompt, agent, deliver_instance, deliver_chat,"
    " misfire_grace_s, active_since, created_at, updated_at, created_by)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
REMOVE = "DELETE FROM cron_jobs WHERE name = ?"
ENABLE = (
    "UPDATE cron_jobs SET enabled = 1, disabled_reason = '', consecutive_failures = 0, active_since = ?,"
    " updated_at = ? WHERE id = ?"
)
DISABLE = "UPDATE cron_jobs SET enabled = 0, disabled_reason = ?, updated_at = ? WHERE id = ?"
FAILED_AGAIN = "UPDATE cron_jobs SET consecutive_failures = consecutive_failures + 1 WHERE id = ?"
SUCCEEDED = "UPDATE cron_jobs SET consecutive_failures = 0 WHERE id = ?"

_COLUMNS = (
    "id, name, schedule, tz, run_at, prompt, agent, deliver_instance, deliver_chat, enabled, created_at, created_by,"
    " misfire_grace_s, consecutive_failures, coalesce(active_since, created_at), disabled_reason, updated_at"
)
GET = "SELECT " + _COLUMNS + " FROM cron_jobs WHERE id = ?"
GET_BY_NAME = "SELECT " + _COLUMNS + " FROM cron_jobs WHERE name = ?"
LIST_FOR_AGENT = "SELECT " + _COLUMNS + " FROM cron_jobs WHERE agent = ? ORDER BY name"
LIST_ALL = "SELECT " + _COLUMNS + " FROM cron_jobs ORDER BY name"
LIST_ENABLED = "SELECT " + _COLUMNS + " FROM cron_jobs WHERE enabled = 1 ORDER BY id"


class CronJob(NamedTuple):
    id: int
    name: str
    schedule: str  # '' for a one-shot job
    tz: str
    run_at: float | None  # one-shot jobs: when
    prompt: str
    agent: str
    deliver_instance: str
    deliver_chat: str
    enabled: int
    created_at: float
    created_by: str
    misfire_grace_s: float | None  # None: derived from the period
    consecutive_failures: int
    active_since: float  # fires count from here (added or last enabled)
    disabled_reason: str
    updated_at: float


def add(
    conn: apsw.Connection, name: str, schedule: str, tz: str, run_at: float | None, prompt: str, agent: str,
    deliver_instance: str, deliver_chat: str, created_by: str, now: float, misfire_grace_s: float | None = None,
    active_since: float | None = None,
) -> int:
    """A new job; a taken name raises apsw.ConstraintError (names are UNIQUE)."""
    conn.execute(ADD, (name, schedule, tz, run_at, prompt, agent, deliver_instance, deliver_chat, misfire_grace_s,
                       active_since if active_since is not None else now, now, now, created_by))
    return conn.last_insert_rowid()


def remove(conn: apsw.Connection, name: str) -> bool:
    conn.execute(REMOVE, (name,))
    return conn.changes() > 0


def enable(conn: apsw.Connection, job_id: int, active_since: float, now: float) -> None:
    """Enabled again: its failures are forgotten and its fires count from ``active_since``."""
    conn.execute(ENABLE, (active_since, now, job_id))


def disable(conn: apsw.Connection, job_id: int, reason: str, now: float) -> None:
    conn.execute(DISABLE, (reason, now, job_id))


def count_outcome(conn: apsw.Connection, job_id: int, failed: bool) -> int:
    """A failure adds one to the job's consecutive failures, a success resets them; returns the count."""
    conn.execute(FAILED_AGAIN if failed else SUCCEEDED, (job_id,))
    job = get(conn, job_id)
    return job.consecutive_failures if job is not None else 0


def get(conn: apsw.Connection, job_id: int) -> CronJob | None:
    row = conn.execute(GET, (job_id,)).fetchone()
    return CronJob(*row) if row is not None else None


def get_by_name(conn: apsw.Connection, name: str) -> CronJob | None:
    row = conn.execute(GET_BY_NAME, (name,)).fetchone()
    return CronJob(*row) if row is not None else None


def list_for_agent(conn: apsw.Connection, agent: str) -> list[CronJob]:
    return [CronJob(*row) for row in conn.execute(LIST_FOR_AGENT, (agent,))]


def list_all(conn: apsw.Connection) -> list[CronJob]:
    return [CronJob(*row) for row in conn.execute(LIST_ALL)]


def list_enabled(conn: apsw.Connection) -> list[CronJob]:
    return [CronJob(*row) for row in conn.execute(LIST_ENABLED)]


# ---------------------------------------------------------------- runs

ADD_RUN = (
    "INSERT OR IGNORE INTO cron_runs (job_id, scheduled_for, state, turn_id, started_at, ended_at, error)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_RUN_COLUMNS = "id, job_id, scheduled_for, state, turn_id, started_at, ended_at, duration_ms, error"
GET_RUN = "SELECT " + _RUN_COLUMNS + " FROM cron_runs WHERE id = ?"
RUN_AT = "SELECT " + _RUN_COLUMNS + " FROM cron_runs WHERE job_id = ? AND scheduled_for = ?"
LAST_SCHEDULED = "SELECT max(scheduled_for) FROM cron_runs WHERE job_id = ?"
END_RUN = (
    "UPDATE cron_runs SET state = ?, ended_at = ?, duration_ms = ?, error = ? WHERE id = ? AND state = 'fired'"
)
# runs whose outcome is not recorded yet, with their turn's state (NULL: the turn is gone)
OPEN_RUNS = (
    "SELECT r.id, r.job_id, j.name, r.scheduled_for, r.turn_id, t.state FROM cron_runs r"
    " JOIN cron_jobs j ON j.id = r.job_id LEFT JOIN turns t ON t.id = r.turn_id WHERE r.state = 'fired'"
    " ORDER BY r.id"
)
TURN_OUTCOME = "SELECT state, error, created_at, done_at FROM turns WHERE id = ?"
_LISTED_RUN = (
    "SELECT r.id, j.name, j.tz, r.scheduled_for, r.state, r.turn_id, r.started_at, r.ended_at, r.duration_ms,"
    " r.error FROM cron_runs r JOIN cron_jobs j ON j.id = r.job_id"
)
RECENT_RUNS = _LISTED_RUN + " ORDER BY r.scheduled_for DESC, r.id DESC LIMIT ?"
RECENT_RUNS_OF = _LISTED_RUN + " WHERE j.name = ? ORDER BY r.scheduled_for DESC LIMIT ?"
LAST_RUN_OF = (
    "SELECT state, scheduled_for FROM cron_runs WHERE job_id = ? ORDER BY scheduled_for DESC LIMIT 1"
)


class Run(NamedTuple):
    id: int
    job_id: int
    scheduled_for: float
    state: str  # fired | ok | failed | skipped
    turn_id: int | None
    started_at: float
    ended_at: float | None
    duration_ms: float | None
    error: str


class OpenRun(NamedTuple):
    id: int
    job_id: int
    job: str
    scheduled_for: float
    turn_id: int | None
    turn_state: str | None  # None: the turn row is gone


class ListedRun(NamedTuple):
    id: int
    job: str
    tz: str
    scheduled_for: float
    state: str
    turn_id: int | None
    started_at: float
    ended_at: float | None
    duration_ms: float | None
    error: str


class TurnOutcome(NamedTuple):
    state: str | None
    error: str
    created_at: float
    done_at: float | None


def add_run(conn: apsw.Connection, job_id: int, scheduled_for: float, state: str, turn_id: int | None,
            started_at: float, error: str = "") -> int | None:
    """A run row, unless (job, scheduled time) has one already: then None and nothing changes."""
    ended_at = started_at if state == "skipped" else None
    conn.execute(ADD_RUN, (job_id, scheduled_for, state, turn_id, started_at, ended_at, error))
    return conn.last_insert_rowid() if conn.changes() else None


def get_run(conn: apsw.Connection, run_id: int) -> Run | None:
    row = conn.execute(GET_RUN, (run_id,)).fetchone()
    return Run(*row) if row is not None else None


def run_at(conn: apsw.Connection, job_id: int, scheduled_for: float) -> Run | None:
    row = conn.execute(RUN_AT, (job_id, scheduled_for)).fetchone()
    return Run(*row) if row is not None else None


def last_scheduled(conn: apsw.Connection, job_id: int) -> float | None:
    """The latest scheduled time that has a run row (fired, ended or skipped)."""
    row = conn.execute(LAST_SCHEDULED, (job_id,)).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def end_run(conn: apsw.Connection, run_id: int, state: str, ended_at: float, duration_ms: float | None,
            error: str) -> bool:
    """Records a fired run's outcome; False when it was recorded already."""
    conn.execute(END_RUN, (state, ended_at, duration_ms, error, run_id))
    return conn.changes() > 0


def open_runs(conn: apsw.Connection) -> list[OpenRun]:
    return [OpenRun(*row) for row in conn.execute(OPEN_RUNS)]


def turn_outcome(conn: apsw.Connection, turn_id: int) -> TurnOutcome | None:
    row = conn.execute(TURN_OUTCOME, (turn_id,)).fetchone()
    return TurnOutcome(*row) if row is not None else None


def recent_runs(conn: apsw.Connection, name: str | None, limit: int) -> list[ListedRun]:
    """The latest runs, newest first: of one job, or of all."""
    rows = conn.execute(RECENT_RUNS_OF, (name, limit)) if name else conn.execute(RECENT_RUNS, (limit,))
    return [ListedRun(*row) for row in rows]


def last_run_of(conn: apsw.Connection, job_id: int) -> tuple[str, float] | None:
    """(state, scheduled time) of a job's latest run."""
    row = conn.execute(LAST_RUN_OF, (job_id,)).fetchone()
    return None if row is None else (row[0], float(row[1]))
