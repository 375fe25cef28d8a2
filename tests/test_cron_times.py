"""Cron as pure functions: checks, fire times across daylight-saving changes, misfire grace, the misfire policy."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter

from common import cron
from common.errors import InvalidInput
from common.stores.cron_store import CronJob
from services.scheduler.plan import MAX_SKIPPED, decide

BERLIN = "Europe/Berlin"


def at(text: str) -> float:
    """An instant from ISO text with its offset, e.g. '2025-03-30T03:00+02:00'."""
    return datetime.fromisoformat(text).timestamp()


def local(stamps: list[float], tz: str = BERLIN) -> list[str]:
    return [cron.local_iso(s, tz) for s in stamps]


def job(schedule: str = "* * * * *", tz: str = "UTC", run_at: float | None = None, grace: float | None = None,
        since: float = 0.0) -> CronJob:
    return CronJob(id=1, name="j", schedule=schedule, tz=tz, run_at=run_at, prompt="p", agent="default",
                   deliver_instance="tg", deliver_chat="c", enabled=1, created_at=since, created_by="",
                   misfire_grace_s=grace, consecutive_failures=0, active_since=since, disabled_reason="",
                   updated_at=since)


# ---------------------------------------------------------------- daylight saving, Europe/Berlin


def test_spring_forward_a_wall_clock_job_in_the_missing_hour_runs_once_at_the_end_of_the_gap():
    fires = cron.fires_between("30 2 * * *", BERLIN, at("2025-03-29T00:00+01:00"), at("2025-04-01T00:00+02:00"))
    assert ["2025-03-29T02:30+01:00", "2025-03-30T03:00+02:00", "2025-03-31T02:30+02:00"] == local(fires)


def test_spring_forward_an_hourly_job_runs_every_real_hour_once():
    fires = cron.fires_between("0 * * * *", BERLIN, at("2025-03-30T00:30+01:00"), at("2025-03-30T05:30+02:00"))
    assert ["2025-03-30T01:00+01:00", "2025-03-30T03:00+02:00", "2025-03-30T04:00+02:00",
            "2025-03-30T05:00+02:00"] == local(fires)
    assert [3600.0] * 3 == [b - a for a, b in zip(fires, fires[1:])]


def test_fall_back_a_wall_clock_job_in_the_repeated_hour_runs_once_at_its_first_occurrence():
    fires = cron.fires_between("30 2 * * *", BERLIN, at("2025-10-25T00:00+02:00"), at("2025-10-28T00:00+01:00"))
    assert ["2025-10-25T02:30+02:00", "2025-10-26T02:30+02:00", "2025-10-27T02:30+01:00"] == local(fires)


def test_fall_back_an_hourly_job_runs_in_both_repeated_hours():
    fires = cron.fires_between("0 * * * *", BERLIN, at("2025-10-26T00:30+02:00"), at("2025-10-26T04:30+01:00"))
    assert ["2025-10-26T01:00+02:00", "2025-10-26T02:00+02:00", "2025-10-26T02:00+01:00", "2025-10-26T03:00+01:00",
            "2025-10-26T04:00+01:00"] == local(fires)
    assert [3600.0] * 4 == [b - a for a, b in zip(fires, fires[1:])]


def test_every_fifteen_minutes_follows_elapsed_time_through_both_changes():
    for start in ("2025-03-30T00:00+01:00", "2025-10-26T00:00+02:00"):
        fires = cron.fires_between("*/15 * * * *", BERLIN, at(start), at(start) + 6 * 3600)
        assert [900.0] * 23 == [b - a for a, b in zip(fires, fires[1:])]


def test_next_fire_from_inside_the_repeated_hour_does_not_go_back():
    second_two_oclock = at("2025-10-26T02:10+01:00")
    assert "2025-10-27T02:30+01:00" == cron.local_iso(cron.next_fire("30 2 * * *", BERLIN, second_two_oclock), BERLIN)
    assert "2025-10-26T02:30+01:00" == cron.local_iso(cron.next_fire("30 * * * *", BERLIN, second_two_oclock), BERLIN)


@pytest.mark.parametrize("schedule", ["* * * * *", "*/7 * * * *", "0 9 * * mon-fri", "15 */3 * * *", "0 0 1 * *",
                                      "@hourly", "@daily"])
@pytest.mark.parametrize("tz", ["UTC", BERLIN, "America/New_York"])
def test_times_no_change_touches_are_croniters(schedule, tz):
    start = datetime(2025, 1, 13, 11, 7, tzinfo=ZoneInfo(tz))
    expected, it = [], croniter(cron.expand(schedule), start)
    while len(expected) < 50:
        expected.append(it.get_next(float))
    ours = cron.fires_between(schedule, tz, start.timestamp(), expected[-1])
    assert expected == ours


# ---------------------------------------------------------------- checks


@pytest.mark.parametrize("schedule,fragment", [
    ("61 * * * *", "out of range or malformed"),
    ("* * * * * *", "five fields"),
    ("every day", "five fields"),
    ("@sometimes", "five fields"),
    ("0 0 30 2 *", "never fires"),
])
def test_a_bad_expression_is_refused_with_what_is_wrong(schedule, fragment):
    with pytest.raises(InvalidInput) as err:
        cron.check_schedule(schedule, "UTC", at("2025-01-01T00:00+00:00"))
    assert fragment in str(err.value)


@pytest.mark.parametrize("tz", ["Mars/Olympus", "../../etc/passwd", "", "Europe"])
def test_an_unknown_time_zone_is_refused(tz):
    with pytest.raises(InvalidInput) as err:
        cron.check_schedule("0 9 * * *", tz, 0)
    assert "unknown time zone" in str(err.value)


def test_a_one_shot_time_is_read_in_the_zone_and_must_be_in_the_future():
    now = at("2030-01-01T00:00+00:00")
    assert at("2030-05-01T09:30+02:00") == cron.parse_at("2030-05-01T09:30", BERLIN, now)
    with pytest.raises(InvalidInput, match="in the past"):
        cron.parse_at("2029-12-31T23:00Z", "UTC", now, label="--at")


def test_deliver_to_must_name_a_known_instance():
    assert ("tg", "42") == cron.parse_deliver_to("tg:42", {"tg", "cli"})
    with pytest.raises(InvalidInput, match="unknown gateway instance 'slack'"):
        cron.parse_deliver_to("slack:C1", {"tg", "cli"})
    with pytest.raises(InvalidInput, match="instance:chat"):
        cron.parse_deliver_to("tg", {"tg"})


# ---------------------------------------------------------------- misfire grace and policy


@pytest.mark.parametrize("schedule,grace", [
    ("* * * * *", 30.0), ("*/5 * * * *", 150.0), ("0 * * * *", 1800.0), ("0 9 * * *", 3600.0), ("", 3600.0),
])
def test_the_default_grace_is_half_the_period_between_30_seconds_and_an_hour(schedule, grace):
    assert grace == cron.default_grace(schedule, "UTC", at("2025-01-15T09:00+00:00"))


T = at("2025-01-15T12:00+00:00")


def test_a_fire_due_now_runs():
    assert (T, (), T + 60) == (lambda d: (d.fire, d.skips, d.next_at))(decide(job(), T - 60, T + 0.2))


def test_nothing_is_due_before_the_next_fire():
    decision = decide(job(), T, T + 59)
    assert (None, (), T + 60) == (decision.fire, decision.skips, decision.next_at)


def test_after_downtime_only_the_latest_missed_fire_runs_late_and_the_older_are_skipped():
    decision = decide(job(), T, T + 10 * 60 + 20)  # down from just after 12:00 until 12:10:20
    skipped, reason = decision.skips[0]
    assert (T + 600, [T + 60 * i for i in range(1, 10)]) == (decision.fire, list(skipped))
    assert "only the latest missed fire" in reason


def test_a_fire_missed_by_more_than_its_grace_is_skipped_not_run():
    decision = decide(job("0 * * * *"), T, T + 3600 + 1801)
    assert (None, [T + 3600]) == (decision.fire, [t for times, _ in decision.skips for t in times])
    assert "more than the misfire grace of 1800s" in decision.skips[-1][1]


def test_a_jobs_own_grace_replaces_the_default():
    late_by_41_minutes = T + 3600 + 2460
    assert (None, T + 3600) == (decide(job("0 * * * *"), T, late_by_41_minutes).fire,
                                decide(job("0 * * * *", grace=7200), T, late_by_41_minutes).fire)


def test_a_fire_is_skipped_while_the_previous_run_is_going():
    decision = decide(job(), T, T + 61, busy_with=T)
    assert (None, [(T + 60,)]) == (decision.fire, [times for times, _ in decision.skips])
    assert "had not ended" in decision.skips[0][1]


def test_fires_count_from_when_the_job_was_added_or_enabled():
    assert (None, ()) == (lambda d: (d.fire, d.skips))(decide(job(since=T + 30), T - 3600, T + 40))


def test_a_one_shot_job_runs_once_late_within_an_hour_and_is_skipped_after():
    late = decide(job("", run_at=T, since=T - 100), None, T + 3000)
    too_late = decide(job("", run_at=T, since=T - 100), None, T + 3700)
    done = decide(job("", run_at=T, since=T - 100), T, T + 10)
    assert (T, None, [(T,)], None) == (late.fire, too_late.fire, [t for t, _ in too_late.skips], done.next_at)


def test_a_long_outage_records_only_the_last_missed_fires():
    decision = decide(job(), T, T + 5 * 86400 + 10)  # five days of an every-minute job
    skipped = list(decision.skips[0][0])
    assert (T + 5 * 86400, MAX_SKIPPED) == (decision.fire, len(skipped))
    assert (skipped[-1], decision.unrecorded_before) == (T + 5 * 86400 - 60, skipped[0])


def test_decisions_are_the_same_in_any_time_zone_far_from_a_change():
    now = T + 21.5 * 3600 + 10  # 09:30:10 UTC the next day
    utc = decide(job("30 9 * * *", tz="UTC"), T, now)
    shifted = decide(job("30 10 * * *", tz=BERLIN), T, now)  # 10:30 CET is 09:30 UTC
    assert (now - 10, now - 10 + timedelta(days=1).total_seconds()) == (utc.fire, utc.next_at)
    assert (utc.fire, utc.next_at) == (shifted.fire, shifted.next_at)
