"""`starling cron add|list|rm|enable|disable|runs` against a real writer: refusals, listings, exit codes."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from common import db
from common.cli.main import main as cli
from common.personas import create_pack
from common.stores import cron_store
from schema import messages as m
from tests.procs import make_home, remove_home, start_writer

CONFIG = '[[gateways.telegram]]\nid = "tg"\n'


@pytest.fixture(scope="module")
def home():
    h = make_home(CONFIG)
    create_pack(h.paths, "default")
    proc = start_writer(h)
    yield h
    proc.stop()
    remove_home(h)


def run(home, capsys, *args: str) -> tuple[int, str, str]:
    code = cli(["--home", str(home.root), "cron", *args])
    out, err = capsys.readouterr()
    return code, out, err


def listed(home, capsys) -> dict[str, dict]:
    code, out, _ = run(home, capsys, "list", "--json")
    assert 0 == code
    return {row["name"]: row for row in json.loads(out)}


def add_args(name: str, *extra: str) -> list[str]:
    return ["add", name, "--prompt", "Summarise the news", "--deliver-to", "tg:42", *extra]


@pytest.mark.parametrize("extra,fragment", [
    (["--schedule", "61 * * * *"], "invalid cron expression '61 * * * *': a field is out of range"),
    (["--schedule", "0 9 * *"], "use five fields"),
    (["--schedule", "0 9 * * *", "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
    (["--at", "2001-01-01T09:00Z"], "--at 2001-01-01T09:00:00+00:00 is in the past"),
    (["--at", "next tuesday"], "invalid --at 'next tuesday'"),
    (["--schedule", "@daily", "--misfire-grace", "5"], "misfire grace must be"),
])
def test_add_refuses_a_bad_value_with_exit_2_and_stores_nothing(home, capsys, extra, fragment):
    code, _, err = run(home, capsys, *add_args("refused", *extra))
    assert (2, True) == (code, fragment in err)
    assert "refused" not in listed(home, capsys)


def test_add_refuses_an_unknown_gateway_instance_or_agent(home, capsys):
    wrong_instance = run(home, capsys, "add", "x", "--schedule", "@daily", "--prompt", "p", "--deliver-to", "slack:C1")
    wrong_agent = run(home, capsys, *add_args("x", "--schedule", "@daily", "--agent", "nobody"))
    assert (2, "unknown gateway instance 'slack'") == (wrong_instance[0], wrong_instance[2].split("error: ")[1][:32])
    assert (2, True) == (wrong_agent[0], "no agent 'nobody'" in wrong_agent[2])


def test_add_needs_a_schedule_or_a_time_but_not_both(home, capsys):
    with pytest.raises(SystemExit) as neither:
        run(home, capsys, *add_args("x"))
    with pytest.raises(SystemExit) as both:
        run(home, capsys, *add_args("x", "--schedule", "@daily", "--at", "2099-01-01T00:00"))
    assert (2, 2) == (neither.value.code, both.value.code)


def test_add_then_list_shows_the_job_with_its_next_run_in_its_zone(home, capsys):
    code, out, _ = run(home, capsys, *add_args("news", "--schedule", "0 9 * * mon-fri", "--tz", "Europe/Berlin"))
    assert (0, True) == (code, out.startswith("Added cron job 'news' (id "))
    row = listed(home, capsys)["news"]
    assert ("enabled", "0 9 * * mon-fri", "Europe/Berlin", "tg:42", "default") == (
        row["state"], row["schedule"], row["tz"], row["deliver_to"], row["agent"])
    assert row["next_run_local"][11:] in ("09:00+01:00", "09:00+02:00")
    assert time.time() < row["next_run"] <= time.time() + 4 * 86400
    _, table, _ = run(home, capsys, "list")
    assert "news" in table and "0 9 * * mon-fri" in table and "Europe/Berlin" in table


def test_a_taken_name_fails_with_exit_1(home, capsys):
    run(home, capsys, *add_args("taken", "--schedule", "@hourly"))
    code, _, err = run(home, capsys, *add_args("taken", "--schedule", "@daily"))
    assert (1, True) == (code, "a cron job named 'taken' already exists" in err)


def test_a_one_shot_job_lists_its_time_as_its_next_run(home, capsys):
    code, out, _ = run(home, capsys, *add_args("dentist", "--at", "2099-03-01T09:30", "--tz", "Europe/Paris"))
    row = listed(home, capsys)["dentist"]
    assert (0, "once (Europe/Paris)") == (code, out.split(": ")[1].split(",")[0])
    assert ("enabled", "", "2099-03-01T09:30+01:00") == (row["state"], row["schedule"], row["next_run_local"])


def test_disable_and_enable(home, capsys):
    run(home, capsys, *add_args("toggle", "--schedule", "*/5 * * * *"))
    disabled = run(home, capsys, "disable", "toggle")[0], listed(home, capsys)["toggle"]
    enabled = run(home, capsys, "enable", "toggle")[0], listed(home, capsys)["toggle"]
    assert (0, "disabled", None) == (disabled[0], disabled[1]["state"], disabled[1]["next_run"])
    assert (0, "enabled", True) == (enabled[0], enabled[1]["state"], enabled[1]["next_run"] > time.time())
    assert 1 == run(home, capsys, "enable", "no-such-job")[0]


def test_runs_show_fires_and_skips_newest_first(home, capsys):
    run(home, capsys, *add_args("ran", "--schedule", "* * * * *"))
    assert (0, "No runs yet.\n") == run(home, capsys, "runs", "ran")[:2]
    job_id = listed_id(home, "ran")
    minute = (time.time() // 60) * 60

    async def scheduler_writes():
        async with home.client("test") as client:
            await client.call(m.CronSkip(job_id=job_id, scheduled_for=[minute - 120], reason="missed: a test"))
            await client.call(m.CronFire(job_id=job_id, scheduled_for=minute - 60))

    asyncio.run(scheduler_writes())
    code, out, _ = run(home, capsys, "runs", "ran", "--json")
    rows = json.loads(out)
    assert (0, ["fired", "skipped"], [minute - 60, minute - 120]) == (
        code, [r["state"] for r in rows], [r["scheduled_for"] for r in rows])
    assert "missed: a test" == rows[1]["error"]
    _, table, _ = run(home, capsys, "runs")
    assert "ran" in table and "skipped" in table and "missed: a test" in table


def listed_id(home, name: str) -> int:
    conn = db.open_reader(home.paths.db_file)
    try:
        with db.read_tx(conn):
            return cron_store.get_by_name(conn, name).id
    finally:
        conn.close()


def test_rm_removes_and_a_second_rm_fails(home, capsys):
    run(home, capsys, *add_args("gone", "--schedule", "@weekly"))
    first, second = run(home, capsys, "rm", "gone"), run(home, capsys, "rm", "gone")
    assert (0, 1, True) == (first[0], second[0], "no cron job named 'gone'" in second[2])
    assert "gone" not in listed(home, capsys)
    assert 1 == run(home, capsys, "runs", "gone")[0]
