"""The sweeper's writes as the writer applies them (services/writer/retention_ops.py), on a real migrated
SQLite file, and the sweeper's pure helpers: local-time boundaries, capture names, symlink-safe pruning."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import apsw
import pytest

from common import db
from common.stores import (
    approval_store, audit_store, db_store, outbox_store, retention_store, session_store,
)
from schema import messages as m
from services.sweeper import files, memory
from services.writer import apply as ops

T = 1_700_000_000.0
DAY = 86400.0


@pytest.fixture
def conn(tmp_path: Path, migrated_file: Path) -> apsw.Connection:
    db_file = tmp_path / "starling.db"
    shutil.copyfile(migrated_file, db_file)
    c = db.open_writer(db_file)
    yield c
    c.close()


def apply(conn, op):
    return ops.apply(conn, op, T, [])


def conversation(conn, chat: str, last: float, turns: int = 4, closed: bool = True, attachment: str = "") -> int:
    sid = retention_store.seed_session(conn, "default", "tg", chat, last - 60, last, last if closed else None)
    for i in range(turns // 2):
        user = retention_store.seed_turn(conn, sid, "user", f"q{i}", last - 60 + i, sender="alice",
                                         attachments_json=json.dumps([attachment] if attachment and i == 0 else []))
        retention_store.seed_turn(conn, sid, "assistant", f"a{i}", last - 60 + i, parent_id=user)
    return sid


# ---------------------------------------------------------------- PurgeSessions


def test_purge_sessions_deletes_only_conversations_last_active_before_the_cutoff(conn):
    old = conversation(conn, "old", T - 10)
    young = conversation(conn, "young", T + 10)
    result = apply(conn, m.PurgeSessions(before=T))
    assert (None, True) == (session_store.get(conn, old), session_store.get(conn, young) is not None)
    assert ({"sessions": 1, "turns": 4}, False) == (result.rows, result.more)


def test_purge_sessions_keeps_a_conversation_with_a_turn_pending_claimed_or_parked(conn):
    kept = []
    for state in ("pending", "claimed", "waiting"):
        sid = conversation(conn, state, T - DAY)
        retention_store.seed_turn(conn, sid, "user", "still in use", T - DAY, state=state)
        kept.append(sid)
    result = apply(conn, m.PurgeSessions(before=T))
    assert ({}, [True, True, True]) == (result.rows, [session_store.get(conn, s) is not None for s in kept])


def test_purge_sessions_returns_the_attachments_of_deleted_turns(conn):
    conversation(conn, "a", T - DAY, attachment="/data/attachments/default/2023-11-13/a.jpg")
    conversation(conn, "b", T + DAY, attachment="/data/attachments/default/2023-11-15/b.jpg")
    assert ["/data/attachments/default/2023-11-13/a.jpg"] == apply(conn, m.PurgeSessions(before=T)).files


def test_purge_sessions_takes_delivered_messages_tool_audit_and_approvals_along(conn):
    sid = conversation(conn, "c", T - DAY)
    sent = retention_store.seed_outbox(conn, sid, None, "tg", "c", "hi", "sent", T - DAY)
    pending = retention_store.seed_outbox(conn, sid, None, "tg", "c", "not yet", "pending", T - DAY)
    audit_store.record_tool(conn, sid, 1, "default", "shell", "{}", "ok", "", "", 1.0, T - DAY)
    approval_store.create(conn, "AP1", sid, 1, "default", "shell", "{}", "", T - 2 * DAY, 60)
    result = apply(conn, m.PurgeSessions(before=T))
    assert {"sessions": 1, "turns": 4, "outbox": 1, "tool_executions": 1, "approvals": 1} == result.rows
    # an undelivered message stays (its conversation is gone: its session becomes NULL)
    assert (None, "pending") == (outbox_store.get(conn, sent), outbox_store.get(conn, pending).state)


def test_purge_sessions_also_drops_old_delivered_messages_and_inbound_keys(conn):
    from common.stores import keys_store

    retention_store.seed_outbox(conn, None, None, "tg", "c", "an old alert", "sent", T - 1)
    retention_store.seed_outbox(conn, None, None, "tg", "c", "a new alert", "sent", T + 1)
    keys_store.remember_inbound(conn, ["old"], 1, T - 1)
    keys_store.remember_inbound(conn, ["new"], 2, T + 1)
    result = apply(conn, m.PurgeSessions(before=T))
    assert ({"outbox": 1, "inbound_keys": 1}, 1, 1) == (
        result.rows, retention_store.remaining(conn)["outbox"], retention_store.remaining(conn)["inbound_keys"])


def test_a_purge_step_stops_at_max_rows_and_says_more(conn):
    for i in range(10):
        conversation(conn, f"c{i}", T - DAY - i, turns=10)
    steps = []
    while True:
        result = apply(conn, m.PurgeSessions(before=T, max_rows=25))
        steps.append(sum(result.rows.values()))
        if not result.more:
            break
    # 110 rows in all (100 turns, 10 sessions): no step past 25 rows plus the session row that ends one
    assert (True, 110, 0) == (max(steps) <= 26, sum(steps), retention_store.remaining(conn)["turns"])


def test_a_purge_step_stops_when_its_time_is_up(conn):
    db_store.begin(conn)  # one commit for the history, not one per row
    for i in range(40):
        conversation(conn, f"c{i}", T - DAY - i, turns=200)
    db_store.commit(conn)
    result = apply(conn, m.PurgeSessions(before=T, max_rows=10**6, max_ms=1.0))
    assert (True, True) == (result.more, 0 < result.rows["turns"] < 8000)


@pytest.mark.parametrize("field, value", [("max_rows", 0), ("max_ms", 0.0), ("max_ms", 5000.0),
                                          ("before", float("nan"))])
def test_a_purge_with_a_bad_bound_is_refused(conn, field, value):
    with pytest.raises(ops.Rejected) as err:
        apply(conn, m.PurgeSessions(**{"before": T, field: value}))
    assert "invalid" == err.value.code


# ---------------------------------------------------------------- PurgeAudit, PurgeJobs


def test_purge_audit_deletes_audit_rows_and_tool_executions_older_than_the_cutoff(conn):
    retention_store.seed_audit(conn, T - 1, "runner", "old")
    retention_store.seed_audit(conn, T + 1, "runner", "new")
    audit_store.record_tool(conn, None, 0, "default", "shell", "{}", "ok", "", "", 1.0, T - 1)
    audit_store.record_tool(conn, None, 0, "default", "shell", "{}", "ok", "", "", 1.0, T + 1)
    result = apply(conn, m.PurgeAudit(before=T))
    counts = retention_store.remaining(conn)
    assert ({"audit": 1, "tool_executions": 1}, 1, 1) == (result.rows, counts["audit"], counts["tool_executions"])


def test_purge_jobs_never_deletes_a_running_job_and_names_the_logs_of_those_it_deletes(conn):
    from common.stores import job_store

    ended = job_store.start(conn, None, "default", "make", 10, "/jobs/ended.log", T - 5 * DAY)
    job_store.end(conn, ended, "done", 0, T - 1)
    later = job_store.start(conn, None, "default", "make", 11, "/jobs/later.log", T - 5 * DAY)
    job_store.end(conn, later, "failed", 2, T + 1)
    job_store.start(conn, None, "default", "sleep", 12, "/jobs/running.log", T - 50 * DAY)
    result = apply(conn, m.PurgeJobs(before=T))
    assert ({"jobs": 1}, ["/jobs/ended.log"], 2) == (result.rows, result.files, retention_store.remaining(conn)["jobs"])


# ---------------------------------------------------------------- ResetSession, MarkCaptured


def test_reset_closes_a_quiet_open_conversation_and_unmaps_its_chat(conn):
    sid = conversation(conn, "c", T - DAY, closed=False)
    apply(conn, m.ResetSession(session_id=sid, reason="daily", last_active_at=T - DAY))
    fresh = session_store.open_session(conn, "default", "tg", "c", T)
    assert ("closed", True) == (session_store.get(conn, sid).state, fresh != sid)


def test_reset_refuses_a_conversation_active_since_the_sweeper_looked(conn):
    sid = conversation(conn, "c", T - DAY, closed=False)
    session_store.touch(conn, sid, T - 10)  # a message came in meanwhile
    with pytest.raises(ops.Rejected) as err:
        apply(conn, m.ResetSession(session_id=sid, reason="idle", last_active_at=T - DAY))
    assert ("conflict", "open") == (err.value.code, session_store.get(conn, sid).state)


def test_reset_refuses_a_conversation_with_a_turn_in_use(conn):
    sid = conversation(conn, "c", T - DAY, closed=False)
    retention_store.seed_turn(conn, sid, "user", "parked", T - DAY, state="waiting")
    with pytest.raises(ops.Rejected):
        apply(conn, m.ResetSession(session_id=sid, reason="idle", last_active_at=T - DAY))


def test_reset_with_an_unknown_reason_is_refused(conn):
    sid = conversation(conn, "c", T - DAY, closed=False)
    with pytest.raises(ops.Rejected) as err:
        apply(conn, m.ResetSession(session_id=sid, reason="new", last_active_at=T))
    assert "invalid" == err.value.code


def test_open_quiet_lists_only_open_conversations_quiet_since_and_not_in_use(conn):
    quiet = conversation(conn, "quiet", T - DAY, closed=False)
    conversation(conn, "closed", T - DAY, closed=True)
    conversation(conn, "active", T + 1, closed=False)
    busy = conversation(conn, "busy", T - DAY, closed=False)
    retention_store.seed_turn(conn, busy, "user", "running", T - DAY, state="claimed")
    assert [(quiet, T - DAY)] == retention_store.open_quiet(conn, T, 10)


def test_mark_captured_marks_once_and_takes_the_conversation_off_the_list(conn):
    sid = conversation(conn, "c", T - DAY)
    before = [s.id for s in retention_store.to_capture(conn, 10)]
    apply(conn, m.MarkCaptured(session_ids=[sid]))
    first = retention_store.captured_at(conn, sid)
    ops.apply(conn, m.MarkCaptured(session_ids=[sid]), T + 100, [])
    assert ([sid], [], T, T) == (before, retention_store.to_capture(conn, 10), first,
                                 retention_store.captured_at(conn, sid))


def test_a_closed_conversation_with_a_turn_still_running_is_not_captured_yet(conn):
    sid = conversation(conn, "c", T - DAY)
    retention_store.seed_turn(conn, sid, "user", "/new", T - DAY, state="claimed")
    assert [] == retention_store.to_capture(conn, 10)


def test_transcript_pages_in_conversation_order(conn):
    sid = retention_store.seed_session(conn, "default", "tg", "c", T, T, T)
    q1 = retention_store.seed_turn(conn, sid, "user", "q1", T)
    q2 = retention_store.seed_turn(conn, sid, "user", "q2", T + 1)
    retention_store.seed_turn(conn, sid, "assistant", "a1", T + 2, parent_id=q1)
    retention_store.seed_turn(conn, sid, "assistant", "a2", T + 3, parent_id=q2)
    first = retention_store.transcript(conn, sid, (0, 0), 3)
    rest = retention_store.transcript(conn, sid, (first[-1].thread, first[-1].id), 3)
    assert ["q1", "a1", "q2", "a2"] == [line.content for line in first + rest]


# ---------------------------------------------------------------- pure helpers


def test_the_daily_boundary_is_the_last_local_boundary_hour(monkeypatch):
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    try:
        # 2024-03-31 is the spring-forward day in Berlin: 04:00 local is 02:00 UTC
        at_0700 = time.mktime((2024, 3, 31, 7, 0, 0, 0, 0, -1))
        at_0300 = time.mktime((2024, 3, 31, 3, 0, 0, 0, 0, -1))
        assert (time.mktime((2024, 3, 31, 4, 0, 0, 0, 0, -1)), time.mktime((2024, 3, 30, 4, 0, 0, 0, 0, -1))) == (
            memory.last_boundary(at_0700, 4), memory.last_boundary(at_0300, 4))
        assert "2024-03-31 02:00" == time.strftime("%Y-%m-%d %H:%M", time.gmtime(memory.last_boundary(at_0700, 4)))
    finally:
        monkeypatch.undo()
        time.tzset()


def test_capture_names_round_trip_and_other_files_are_not_captures():
    when = time.mktime((2024, 5, 1, 23, 0, 0, 0, 0, -1))
    assert (when, when, None, None) == (
        memory.stem_time(memory.file_stem(when) + ".md"), memory.stem_time(memory.file_stem(when) + "-2.md"),
        memory.stem_time("notes.md"), memory.stem_time("2024-05-01-2300.txt"))


def test_prune_tree_removes_old_files_and_links_but_never_follows_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    victim = outside / "victim.txt"
    victim.write_text("keep me")
    os.utime(victim, (T - 100 * DAY, T - 100 * DAY))
    root = tmp_path / "pad"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "old.txt").write_text("old")
    (root / "young.txt").write_text("young")
    (root / "link").symlink_to(outside / "victim.txt")
    (root / "dirlink").symlink_to(outside)
    for path, when in ((root / "sub" / "old.txt", T - 10 * DAY), (root / "sub", T - 10 * DAY),
                       (root / "young.txt", T)):
        os.utime(path, (when, when))
    for link in (root / "link", root / "dirlink"):
        os.utime(link, (T - 10 * DAY, T - 10 * DAY), follow_symlinks=False)
    freed = files.prune_tree(root, T - DAY)
    left = sorted(p.name for p in root.iterdir())
    assert (["young.txt"], True, 3, 1) == (left, victim.exists(), freed.files, freed.folders)


def test_prune_tree_of_a_folder_that_is_a_link_does_nothing(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "old.txt").write_text("old")
    os.utime(outside / "old.txt", (T - 10 * DAY, T - 10 * DAY))
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / ".scratchpad").symlink_to(outside)
    freed = files.prune_tree(tmp_path, T, None, "agent", ".scratchpad")
    assert (0, True) == (freed.files, (outside / "old.txt").exists())


def test_remove_files_removes_only_paths_inside_its_folder(tmp_path):
    inside = tmp_path / "attachments" / "default" / "2024-05-01"
    inside.mkdir(parents=True)
    (inside / "a.jpg").write_bytes(b"12345")
    other = tmp_path / "other.txt"
    other.write_text("mine")
    escape = str(tmp_path / "attachments" / ".." / "other.txt")
    freed = files.remove_files([str(inside / "a.jpg"), str(other), escape, str(inside / "gone.jpg")],
                               tmp_path / "attachments")
    # the emptied day folder goes too
    assert (1, 5, 1, True, False) == (freed.files, freed.bytes, freed.folders, other.exists(), inside.exists())


def test_purge_audit_deletes_finished_cron_runs_but_keeps_each_jobs_latest(conn):
    from common.stores import cron_store

    DAY_ = 86400.0
    busy = apply(conn, m.CronAdd(name="busy", prompt="p", agent="default", deliver_instance="cli",
                                 deliver_chat="c", schedule="0 * * * *", active_since=T - 10 * DAY_)).id
    quiet = apply(conn, m.CronAdd(name="quiet", prompt="p", agent="default", deliver_instance="cli",
                                  deliver_chat="c", schedule="0 0 1 1 *", active_since=T - 10 * DAY_)).id
    apply(conn, m.CronSkip(job_id=busy, scheduled_for=[T - 3 * DAY_, T - 2 * DAY_], reason="missed"))
    apply(conn, m.CronFire(job_id=busy, scheduled_for=T - DAY_, started_at=T - DAY_))  # still running
    apply(conn, m.CronSkip(job_id=quiet, scheduled_for=[T - 5 * DAY_], reason="missed"))
    result = apply(conn, m.PurgeAudit(before=T))
    assert 2 == result.rows.get("cron_runs")
    assert T - DAY_ == cron_store.last_scheduled(conn, busy) and T - 5 * DAY_ == cron_store.last_scheduled(conn, quiet)
