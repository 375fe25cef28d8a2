"""Session memory and resets end to end: a real writer and a real sweeper process (local time Europe/Berlin),
conversations closed by /new, by the daily and the idle reset, captured once and dated by their last
activity; old captures removed."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from zoneinfo import ZoneInfo

from common import db
from common.db import read_tx
from common.stores import retention_store, session_store
from schema import messages as m
from tests.procs import wait_until
from tests.sweeper_helpers import DAY, TZ, running, start_sweeper, touch, wait_for

BERLIN = ZoneInfo(TZ)
MEMORY = '[health]\nheartbeat_interval_ms = 200\n[session_memory]\nactive_dir = "memories"\nretention_days = 3\n'


def local(day: dt.date, hour: int, minute: int = 0) -> float:
    return dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=BERLIN).timestamp()


def evening_chat(conn, chat: str, day: dt.date, open_: bool = True) -> int:
    """A chat alive from 22:15 until 23:00 on ``day``."""
    sid = retention_store.seed_session(conn, "default", "tg", chat, local(day, 22, 15), local(day, 23, 0),
                                       None if open_ else local(day, 23, 0))
    for at, text, answer in ((local(day, 22, 15), "Shall we plan the trip to Lisbon?", "Yes: when do you leave?"),
                             (local(day, 23, 0), "Tomorrow. Good night", "Good night!")):
        user = retention_store.seed_turn(conn, sid, "user", text, at, sender="Alice")
        retention_store.seed_turn(conn, sid, "assistant", answer, at + 20, parent_id=user)
    return sid


def state_of(home, session_id: int) -> tuple[str, float | None]:
    reader = db.open_reader(home.paths.db_file)
    try:
        with read_tx(reader) as conn:
            return session_store.get(conn, session_id).state, retention_store.captured_at(conn, session_id)
    finally:
        reader.close()


async def say(home, chat: str, text: str, key: str) -> m.Accepted:
    async with home.client("chat") as client:
        return await client.call(m.Inbound(agent="default", instance="tg", chat=chat, sender="alice", text=text,
                                           dedupe_keys=[key]))


def test_a_chat_ended_by_new_the_next_morning_is_filed_under_the_evening_before(monkeypatch):
    yesterday = dt.datetime.now(BERLIN).date() - dt.timedelta(days=1)
    sid = None

    def fill(conn, home):
        nonlocal sid
        sid = evening_chat(conn, "c1", yesterday)

    with running(MEMORY, fill) as (home, procs):
        sweeper = start_sweeper(home, monkeypatch)  # wall time: /new arrives now, a day or more later
        procs.append(sweeper)

        async def new_conversation() -> None:
            """What a runner does with "/new": claim the turn, close the session, answer."""
            accepted = await say(home, "c1", "/new", "tg:new")
            async with home.client("runner") as client:
                claim = await client.call(m.ClaimTurn(worker="r1"))
                assert (sid, accepted.turn_id) == (accepted.session_id, claim.turn_id)
                await client.call(m.CloseSession(session_id=sid, reason="new"))
                await asyncio.sleep(0.5)  # ticks pass while the /new turn runs: not captured before it ends
                await client.call(m.FinishTurn(turn_id=claim.turn_id, worker="r1", answer="Started a new conversation.",
                                               replies=[m.Reply(text="Started a new conversation.")]))

        asyncio.run(new_conversation())
        captured = wait_for(sweeper, "session_captured")
        wait_until(lambda: state_of(home, sid)[1] is not None, timeout=10, what="the capture to be marked")
        name = f"{yesterday:%Y-%m-%d}-2300.md"
        path = home.paths.memories_dir / name
        lines = path.read_text().splitlines()
        assert ([name], str(path), sid, "closed") == (
            [p.name for p in home.paths.memories_dir.iterdir()], captured[0]["path"], captured[0]["session_id"],
            state_of(home, sid)[0])
        # the conversation, not the command that ended it nor its answer
        assert ["**Alice** · 22:15", "Shall we plan the trip to Lisbon?", "Good night!"] == [
            line for line in lines if line in ("**Alice** · 22:15", "Shall we plan the trip to Lisbon?", "Good night!")]
        assert ([], []) == ([line for line in lines if line == "/new"],
                            [line for line in lines if "Started a new conversation" in line])
        time.sleep(1.0)  # five more ticks: a captured conversation is not written again
        assert (1, 1) == (len(list(home.paths.memories_dir.iterdir())), len(wait_for(sweeper, "session_captured")))


def test_the_daily_reset_closes_at_the_boundary_and_files_by_last_activity(monkeypatch):
    today = dt.datetime.now(BERLIN).date()
    yesterday = today - dt.timedelta(days=1)
    ids: dict[str, int] = {}

    def fill(conn, home):
        ids["evening"] = evening_chat(conn, "c2", yesterday)
        # active after today's 04:00 boundary: not due
        ids["morning"] = retention_store.seed_session(conn, "default", "tg", "c3", local(today, 5), local(today, 5))
        retention_store.seed_turn(conn, ids["morning"], "user", "early bird", local(today, 5), sender="Bob")

    config = MEMORY + '[session_memory.reset]\nmode = "daily"\nboundary_hour = 4\n'
    with running(config, fill) as (home, procs):
        sweeper = start_sweeper(home, monkeypatch, clock=local(today, 7))
        procs.append(sweeper)
        reset = wait_for(sweeper, "sessions_reset")[0]
        wait_for(sweeper, "session_captured")
        path = home.paths.memories_dir / f"{yesterday:%Y-%m-%d}-2300.md"
        assert (1, "daily", f"{today:%Y-%m-%d} 04:00") == (reset["count"], reset["reason"], reset["quiet_since"])
        assert (True, True) == (path.exists(), "ended by the daily reset" in path.read_text())
        assert ["closed", "open"] == [state_of(home, ids[k])[0] for k in ("evening", "morning")]
        # the first message next morning starts a fresh conversation; the morning chat goes on
        fresh = asyncio.run(say(home, "c2", "Good morning", "tg:m1")).session_id
        same = asyncio.run(say(home, "c3", "still here", "tg:m2")).session_id
        assert (True, ids["morning"]) == (fresh != ids["evening"], same)


def test_the_idle_reset_closes_only_conversations_quiet_for_idle_minutes(monkeypatch):
    now = dt.datetime(2025, 6, 10, 15, 0, tzinfo=BERLIN).timestamp()
    ids: dict[str, int] = {}

    def fill(conn, home):
        for name, quiet_s in (("quiet", 2 * 3600), ("recent", 30 * 60)):
            last = now - quiet_s
            ids[name] = retention_store.seed_session(conn, "default", "tg", name, last - 600, last)
            retention_store.seed_turn(conn, ids[name], "user", f"{name} chat", last, sender="Alice")

    config = MEMORY + '[session_memory.reset]\nmode = "idle"\nidle_minutes = 60\n'
    with running(config, fill) as (home, procs):
        sweeper = start_sweeper(home, monkeypatch, clock=now)
        procs.append(sweeper)
        wait_for(sweeper, "session_captured")
        assert ["closed", "open"] == [state_of(home, ids[k])[0] for k in ("quiet", "recent")]
        assert ["2025-06-10-1300.md"] == sorted(p.name for p in home.paths.memories_dir.iterdir())


def test_old_captures_are_removed_and_a_conversation_past_retention_is_not_written(monkeypatch):
    now = dt.datetime(2025, 6, 10, 15, 0, tzinfo=BERLIN).timestamp()
    ids: dict[str, int] = {}

    def fill(conn, home):
        old = now - 5 * DAY  # closed but never captured (memory was off then): past the 3 days, not written
        ids["old"] = retention_store.seed_session(conn, "default", "tg", "old", old - 60, old, old, "new")
        retention_store.seed_turn(conn, ids["old"], "user", "long ago", old)
        ids["empty"] = retention_store.seed_session(conn, "default", "tg", "empty", now - 60, now - 60, now - 60, "new")
        retention_store.seed_turn(conn, ids["empty"], "user", "/new", now - 60)  # nothing but a command

    with running(MEMORY, fill) as (home, procs):
        folder = home.paths.memories_dir
        expired = touch(folder / "2025-06-05-0900.md", now - 5 * DAY)
        expired_twin = touch(folder / "2025-06-07-1459-2.md", now - 3 * DAY - 60)
        kept = touch(folder / "2025-06-07-1501.md", now - 3 * DAY + 60)
        notes = touch(folder / "notes.md", now - 90 * DAY)  # not a capture: never ours to remove
        sweeper = start_sweeper(home, monkeypatch, clock=now)
        procs.append(sweeper)
        swept = wait_for(sweeper, "retention_swept")[0]
        assert 2 == swept["files"]["captures"]
        assert [False, False, True, True] == [p.exists() for p in (expired, expired_twin, kept, notes)]
        assert [True, True] == [state_of(home, ids[k])[1] is not None for k in ("old", "empty")]
        assert ["2025-06-07-1501.md", "notes.md"] == sorted(p.name for p in folder.iterdir())
