"""The writer's cron operations applied to a migrated database (no processes): fires, skips, outcomes, failures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common import db
from common.stores import cron_store, outbox_store, schema_store, turn_store
from schema import messages as m
from services.writer.apply import Rejected, apply

T0 = 1_736_928_000.0  # 2025-01-15T08:00Z


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "starling.db"
    conn = db.open_writer(path)
    schema_store.migrate(conn, path)
    conn.close()
    return path


@pytest.fixture
def conn(template, tmp_path):
    path = tmp_path / "starling.db"
    shutil.copy(template, path)
    c = db.open_writer(path)
    yield c
    c.close()


def do(conn, op, now: float = T0, events: list | None = None):
    return apply(conn, op, now, [] if events is None else events)


def add(conn, name: str = "job", schedule: str = "* * * * *", **kw) -> int:
    return do(conn, m.CronAdd(name=name, prompt="say hi", agent="default", deliver_instance="tg", deliver_chat=name,
                              schedule=schedule, **kw)).id


def finish(conn, ok: bool, error: str = "") -> None:
    claim = do(conn, m.ClaimTurn(worker="w"))
    do(conn, m.FinishTurn(turn_id=claim.turn_id, worker="w", ok=ok, error=error, replies=[m.Reply(text="a")]),
       now=T0 + 62.5)


def test_a_fire_stores_the_run_and_a_turn_from_the_job(conn):
    job_id = add(conn)
    events: list = []
    accepted = do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 60, started_at=T0 + 61), now=T0 + 61, events=events)
    run = cron_store.run_at(conn, job_id, T0 + 60)
    turn = turn_store.get(conn, accepted.turn_id)
    assert ("fired", accepted.turn_id, T0 + 61) == (run.state, run.turn_id, run.started_at)
    assert ("say hi", "cron:job", "pending") == (turn.content, turn.sender, turn.state)
    assert [m.TurnPending] == [cls for _, cls, _ in events]


def test_a_second_fire_of_the_same_time_changes_nothing(conn):
    job_id = add(conn)
    first = do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 60))
    again = do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 60))
    assert (first.turn_id, True, 1) == (again.turn_id, again.duplicate, turn_store.count(conn))


def test_a_skip_leaves_times_that_have_a_run_as_they_are(conn):
    job_id = add(conn)
    do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 60))
    do(conn, m.CronSkip(job_id=job_id, scheduled_for=[T0 + 60, T0 + 120], reason="missed"))
    late = do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 120))
    states = [(r.scheduled_for - T0, r.state) for r in sorted(cron_store.recent_runs(conn, "job", 10))]
    assert ([(60.0, "fired"), (120.0, "skipped")], True, 0) == (
        sorted(states), late.duplicate, late.turn_id)


def test_a_disabled_or_removed_job_does_not_fire(conn):
    job_id = add(conn)
    do(conn, m.CronSetEnabled(name="job", enabled=False))
    with pytest.raises(Rejected) as disabled:
        do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 60))
    do(conn, m.CronRemove(name="job"))
    with pytest.raises(Rejected) as removed:
        do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 60))
    assert ("conflict", "not_found") == (disabled.value.code, removed.value.code)


def test_an_outcome_is_read_from_the_turn_once_it_has_ended(conn):
    job_id = add(conn)
    do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 60, started_at=T0 + 60))
    run_id = cron_store.run_at(conn, job_id, T0 + 60).id
    with pytest.raises(Rejected) as running:
        do(conn, m.CronRunEnd(run_id=run_id))
    finish(conn, ok=False, error="model down")
    ended = do(conn, m.CronRunEnd(run_id=run_id))
    again = do(conn, m.CronRunEnd(run_id=run_id))
    run = cron_store.get_run(conn, run_id)
    assert "conflict" == running.value.code
    assert (ended.outcome, ended.consecutive_failures, again.consecutive_failures) == ("failed", 1, 1)
    assert ("failed", "model down", True) == (run.state, run.error, run.duration_ms >= 0)


def run_once(conn, job_id: int, n: int, ok: bool, limit: int = 3) -> m.CronRunEnded:
    do(conn, m.CronFire(job_id=job_id, scheduled_for=T0 + 60 * n))
    finish(conn, ok=ok, error="" if ok else f"failure {n}")
    return do(conn, m.CronRunEnd(run_id=cron_store.run_at(conn, job_id, T0 + 60 * n).id, max_consecutive_failures=limit,
                                 alert_instance="tg", alert_chat="ops"))


def test_failures_in_a_row_disable_the_job_and_queue_one_alert(conn):
    job_id = add(conn)
    counts = [run_once(conn, job_id, n, ok).consecutive_failures for n, ok in enumerate([False, True, False, False], 1)]
    last = run_once(conn, job_id, 5, False)
    job = cron_store.get(conn, job_id)
    alerts = [row.body for row in outbox_store.for_chat(conn, "tg", "ops")]
    assert ([1, 0, 1, 2], 3, True) == (counts, last.consecutive_failures, last.disabled)
    assert (0, "3 consecutive failures (last: failure 5)") == (job.enabled, job.disabled_reason)
    assert 1 == len(alerts)
    assert "'job' failed 3 times in a row" in alerts[0] and "failure 5" in alerts[0]


def test_enabling_clears_failures_and_counts_fires_from_then(conn):
    job_id = add(conn)
    for n in (1, 2, 3):
        run_once(conn, job_id, n, ok=False)
    do(conn, m.CronSetEnabled(name="job", enabled=True, active_since=T0 + 900), now=T0 + 1000)
    job = cron_store.get(conn, job_id)
    assert (1, 0, T0 + 900, "") == (job.enabled, job.consecutive_failures, job.active_since, job.disabled_reason)


def test_the_writer_refuses_what_the_cli_refuses(conn):
    refused = []
    for fields in ({"schedule": "61 * * * *"}, {"schedule": "0 9 * * *", "tz": "Mars/Olympus"}, {"schedule": ""},
                   {"schedule": "@daily", "run_at": T0 + 100}, {"schedule": "@daily", "misfire_grace_s": -1.0}):
        with pytest.raises(Rejected) as err:
            add(conn, **fields)
        refused.append(err.value.code)
    add(conn, "taken")
    with pytest.raises(Rejected) as taken:
        add(conn, "taken")
    assert (["invalid"] * 5, "conflict") == (refused, taken.value.code)


def test_changes_to_jobs_wake_the_scheduler(conn):
    events: list = []
    do(conn, m.CronAdd(name="j", prompt="p", agent="a", deliver_instance="tg", deliver_chat="c", schedule="@daily"),
       events=events)
    do(conn, m.CronSetEnabled(name="j", enabled=False), events=events)
    do(conn, m.CronRemove(name="j"), events=events)
    assert [m.TOPIC_CRON] * 3 == [topic for topic, _, _ in events]
