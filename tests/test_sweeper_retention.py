"""Retention end to end: a real writer and a real sweeper process on a real SQLite file, the sweeper's clock
injected. Exactly what is past its window goes and nothing younger; a running job's log stays; files go
only after their rows."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from pathlib import Path

from common import db
from common.db import read_tx
from common.stores import audit_store, job_store, keys_store, retention_store, session_store, turn_store
from schema import messages as m
from tests.sweeper_helpers import DAY, running, start_sweeper, touch, wait_for

M = 60.0  # each window's edge: one minute past it goes, one minute short of it stays
CONFIG = """\
[health]
heartbeat_interval_ms = 200
[retention]
session_days = 30
audit_days = 20
job_log_days = 14
tool_output_days = 2
scratchpad_days = 3
"""


def day_folder(home, when: float) -> Path:
    """Where a gateway files an attachment received at ``when``: data/attachments/<agent>/<UTC date>/."""
    return home.paths.attachments_dir / "default" / time.strftime("%Y-%m-%d", time.gmtime(when))


def read(home, fn):
    reader = db.open_reader(home.paths.db_file)
    try:
        with read_tx(reader) as conn:
            return fn(conn)
    finally:
        reader.close()


def test_retention_removes_exactly_what_is_past_each_window(monkeypatch):
    T = float(int(time.time()))
    ids: dict[str, int] = {}
    made: dict[str, Path] = {}  # files rows refer to

    def fill(conn, home):
        old, young = T - 30 * DAY - M, T - 30 * DAY + M
        # conversations (30 days), with attachments, delivered messages and tool audit
        for name, last, closed in (("old", old, True), ("quiet", old, False), ("young", young, True)):
            sid = retention_store.seed_session(conn, "default", "tg", name, last - DAY, last, last if closed else None)
            made[name] = day_folder(home, last - DAY) / f"{name}.jpg"
            user = retention_store.seed_turn(conn, sid, "user", f"{name} photo", last - DAY, sender="alice",
                                             attachments_json=json.dumps([str(made[name])]))
            retention_store.seed_turn(conn, sid, "assistant", "nice", last, parent_id=user)
            retention_store.seed_outbox(conn, sid, user, "tg", name, "nice", "sent", last)
            audit_store.record_tool(conn, sid, user, "default", "shell", "{}", "ok", "", "", 1.0, last)
            ids[name] = sid
        retention_store.seed_outbox(conn, ids["old"], None, "tg", "old", "still retrying", "pending", old)
        # far past the window, but in use: a turn pending, a turn parked on an approval
        for state in ("pending", "waiting"):
            sid = retention_store.seed_session(conn, "default", "tg", state, T - 45 * DAY, T - 45 * DAY)
            made[state] = day_folder(home, T - 45 * DAY) / f"{state}.pdf"
            retention_store.seed_turn(conn, sid, "user", "in use", T - 45 * DAY, state=state,
                                      attachments_json=json.dumps([str(made[state])]))
            ids[state] = sid
        # audit (20 days)
        retention_store.seed_audit(conn, T - 20 * DAY - M, "runner", "old")
        retention_store.seed_audit(conn, T - 20 * DAY + M, "runner", "young")
        for at in (T - 20 * DAY - M, T - 20 * DAY + M):
            audit_store.record_tool(conn, None, 0, "default", "shell", "{}", "ok", "", "", 1.0, at)
        # background jobs (14 days): ended past the window, ended within it, running for 60 days
        for name, ended in (("ended", T - 14 * DAY - M), ("recent", T - 14 * DAY + M), ("running", None)):
            made[f"{name}_log"] = home.paths.jobs_dir / f"{name}.log"
            job = job_store.start(conn, None, "default", name, 100, str(made[f"{name}_log"]), T - 60 * DAY)
            if ended is not None:
                job_store.end(conn, job, "done", 0, ended)
            ids[f"job_{name}"] = job
        keys_store.remember_inbound(conn, ["tg:old"], 1, T - 30 * DAY - M)
        keys_store.remember_inbound(conn, ["tg:young"], 2, T - 30 * DAY + M)

    with running(CONFIG, fill) as (home, procs):
        paths = home.paths
        for key in ("old", "quiet", "young", "pending", "waiting"):
            touch(made[key], T - 40 * DAY, b"a" * 1000)
        for key, mtime in (("ended_log", T - 14 * DAY - M), ("recent_log", T - 14 * DAY - M),
                           ("running_log", T - 60 * DAY)):  # a quiet running job: its log is old, and stays
            touch(made[key], mtime)
        orphan_old = touch(paths.jobs_dir / "orphan-old.log", T - 14 * DAY - M)  # no row names these
        orphan_young = touch(paths.jobs_dir / "orphan-young.log", T - 14 * DAY + M)
        # attachments no turn names: a day folder older than every remaining conversation of the agent
        # goes; a younger one stays (a conversation that began before it may refer to it)
        stray_old = touch(day_folder(home, T - 50 * DAY) / "stray.bin", T - 50 * DAY)
        stray_young = touch(day_folder(home, T - 44 * DAY) / "stray.bin", T - 44 * DAY)
        not_a_day = touch(paths.attachments_dir / "default" / "misc" / "keep.bin", T - 90 * DAY)
        # tool output (2 days): a session folder emptied by the sweep goes with its last file
        out_old = touch(paths.tool_output_dir / "7" / "1-1-shell.txt", T - 2 * DAY - M, b"o" * 100)
        out_young = touch(paths.tool_output_dir / "7" / "2-1-shell.txt", T - 2 * DAY + M)
        emptied = touch(paths.tool_output_dir / "8" / "1-1-shell.txt", T - 5 * DAY).parent
        os.utime(emptied, (T - 5 * DAY, T - 5 * DAY))
        # scratchpads (3 days): a link is removed as a link, never followed; a scratchpad that is a
        # link is not walked; files beside the scratchpad are not its
        pad = paths.private_root / "default" / ".scratchpad"
        pad_old = touch(pad / "old.txt", T - 3 * DAY - M, b"s" * 10)
        pad_young = touch(pad / "young.txt", T - 3 * DAY + M)
        target = touch(paths.shared_workspace / "keep.txt", T - 90 * DAY)
        (pad / "link").symlink_to(target)
        os.utime(pad / "link", (T - 9 * DAY, T - 9 * DAY), follow_symlinks=False)
        notes = touch(paths.private_root / "default" / "notes.txt", T - 90 * DAY)
        victim = touch(paths.shared_workspace / "victim" / "old.txt", T - 90 * DAY)
        (paths.private_root / "other").mkdir()
        (paths.private_root / "other" / ".scratchpad").symlink_to(victim.parent)

        sweeper = start_sweeper(home, monkeypatch, clock=T)
        procs.append(sweeper)
        swept = wait_for(sweeper, "retention_swept")[0]

        # rows: 2 conversations (4 turns, 2 sent messages, 2 tool runs); past 20 days: 1 audit row and 2 tool
        # runs (the young conversation's too: the tool audit has its own window); 1 job, 1 inbound key
        assert {"sessions": 2, "turns": 4, "outbox": 2, "tool_executions": 4, "audit": 1, "jobs": 1,
                "inbound_keys": 1} == swept["rows"]
        left = read(home, retention_store.remaining)
        assert {"sessions": 3, "turns": 4, "outbox": 2, "tool_executions": 1, "approvals": 0, "audit": 1, "jobs": 2,
                "inbound_keys": 1} == left
        kept = read(home, lambda conn: {
            **{k: session_store.get(conn, ids[k]) is not None for k in ("old", "quiet", "young", "pending", "waiting")},
            **{k: job_store.get(conn, ids[f"job_{k}"]) is not None for k in ("ended", "recent", "running")},
        })
        assert {"old": False, "quiet": False, "young": True, "pending": True, "waiting": True,
                "ended": False, "recent": True, "running": True} == kept

        assert {"old": False, "quiet": False, "young": True, "pending": True, "waiting": True,
                "ended_log": False, "recent_log": True, "running_log": True} == {k: p.exists() for k, p in made.items()}
        assert [False, True] == [orphan_old.exists(), orphan_young.exists()]
        assert [False, True, True] == [stray_old.parent.exists(), stray_young.exists(), not_a_day.exists()]
        assert [False, True, False] == [out_old.exists(), out_young.exists(), emptied.exists()]
        assert [False, True, False, True, True, True] == [
            pad_old.exists(), pad_young.exists(), os.path.lexists(pad / "link"), target.exists(), notes.exists(),
            victim.exists()]
        assert {"attachments": 3, "job_logs": 2, "tool_output": 2, "scratchpad": 2, "captures": 0} == swept["files"]
        assert swept["bytes_freed"] >= 2 * 1000 + 100 + 10

        async def hello_again() -> m.Accepted:
            async with home.client("t") as client:
                return await client.call(m.Inbound(agent="default", instance="tg", chat="quiet", sender="alice",
                                                   text="hello again", dedupe_keys=["tg:again"]))

        # the chat whose open conversation was deleted starts a fresh one
        assert ids["quiet"] != asyncio.run(hello_again()).session_id


def test_files_go_only_after_their_rows(monkeypatch):
    """While the sweep runs, an attachment seen gone must belong to a turn already gone from the database
    (in a snapshot taken after the look): rows are committed first, files removed after the ack."""
    T = float(int(time.time()))
    count = 600
    made: list[tuple[int, Path]] = []  # (the turn that names the file, the file)

    def fill(conn, home):
        for i in range(count):
            last = T - 40 * DAY + i
            sid = retention_store.seed_session(conn, "default", "tg", f"c{i}", last, last, last)
            path = home.paths.attachments_dir / "default" / f"d{i % 7}" / f"{i}.jpg"
            for j in range(4):  # the photo comes last: a step may stop between a conversation's turns
                retention_store.seed_turn(conn, sid, "user", f"question {j}", last)
            user = retention_store.seed_turn(conn, sid, "user", "photo", last,
                                             attachments_json=json.dumps([str(path)]))
            made.append((user, path))

    with running(CONFIG, fill) as (home, procs):
        for _sid, path in made:
            touch(path, T - 40 * DAY)
        violations: list[int] = []
        seen_gone = 0
        done = threading.Event()

        def watch() -> None:
            nonlocal seen_gone
            reader = db.open_reader(home.paths.db_file)
            try:
                while not done.is_set():
                    for turn_id, path in made:
                        if path.exists():
                            continue
                        seen_gone += 1
                        with read_tx(reader) as conn:
                            if turn_store.get(conn, turn_id) is not None:
                                violations.append(turn_id)
            finally:
                reader.close()

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            sweeper = start_sweeper(home, monkeypatch, clock=T)
            procs.append(sweeper)
            swept = wait_for(sweeper, "retention_swept")[0]
        finally:
            done.set()
            watcher.join(10)
        assert ([], count, count * 5, 0) == (violations, swept["rows"]["sessions"], swept["rows"]["turns"],
                                            sum(p.exists() for _s, p in made))
        assert (True, True) == (swept["steps"] >= 3, seen_gone > 0)  # several steps; the watcher saw files go
