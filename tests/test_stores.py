"""The store modules against a real, migrated SQLite file: one behaviour per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import apsw
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common import db
from common.stores import (
    beat_store,
    db_store,
    keys_store,
    outbox_store,
    recall_store,
    schema_store,
    session_store,
    turn_store,
)

T0 = 1_700_000_000.0
LEASE = 30.0


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    return tmp_path / "starling.db"


@pytest.fixture
def conn(db_file: Path, migrated_file: Path) -> apsw.Connection:
    shutil.copyfile(migrated_file, db_file)
    c = db.open_writer(db_file)
    schema_store.migrate(c, db_file)
    yield c
    c.close()


def new_session(
    conn: apsw.Connection, chat: str = "chat-1", agent: str = "main", instance: str = "tg"
) -> int:
    return session_store.open_session(conn, agent, instance, chat, T0)


def user_turn(conn: apsw.Connection, session_id: int, text: str = "hello", now: float = T0) -> int:
    return turn_store.add_user_turn(conn, session_id, text, "alice", "Alice", "m1", "", "[]", "{}", now)


def enqueue(
    conn: apsw.Connection, chat: str = "c1", instance: str = "tg", text: str = "hi", now: float = T0
) -> int:
    return outbox_store.enqueue(conn, None, None, instance, chat, text, "", "", now)


# --- session_store ---------------------------------------------------------------------------


def test_open_session_reuses_the_mapped_open_session(conn):
    first = session_store.open_session(conn, "main", "tg", "chat-1", T0)
    second = session_store.open_session(conn, "main", "tg", "chat-1", T0 + 5)
    assert first == second


def test_open_session_is_separate_per_agent_instance_and_chat(conn):
    ids = {
        session_store.open_session(conn, "main", "tg", "chat-1", T0),
        session_store.open_session(conn, "main", "tg", "chat-2", T0),
        session_store.open_session(conn, "main", "slack", "chat-1", T0),
        session_store.open_session(conn, "other", "tg", "chat-1", T0),
    }
    assert 4 == len(ids)


def test_open_session_of_a_mapped_session_touches_it(conn):
    sid = session_store.open_session(conn, "main", "tg", "chat-1", T0)
    session_store.open_session(conn, "main", "tg", "chat-1", T0 + 60)
    assert T0 + 60 == session_store.get(conn, sid).last_active_at


def test_close_makes_the_next_open_session_start_a_new_one(conn):
    old = session_store.open_session(conn, "main", "tg", "chat-1", T0)
    session_store.close(conn, old, "new", T0 + 1)
    new = session_store.open_session(conn, "main", "tg", "chat-1", T0 + 2)
    assert old != new


def test_close_records_state_time_and_returns_true(conn):
    sid = new_session(conn)
    closed = session_store.close(conn, sid, "reset", T0 + 9)
    session = session_store.get(conn, sid)
    assert (True, "closed", T0 + 9) == (closed, session.state, session.closed_at)


def test_close_of_a_closed_session_returns_false(conn):
    sid = new_session(conn)
    session_store.close(conn, sid, "reset", T0 + 1)
    assert session_store.close(conn, sid, "reset", T0 + 2) is False


def test_touch_sets_last_active_at(conn):
    sid = new_session(conn)
    session_store.touch(conn, sid, T0 + 42)
    assert T0 + 42 == session_store.get(conn, sid).last_active_at


def test_set_summary_stores_the_summary_and_what_it_covers(conn):
    sid = new_session(conn)
    session_store.set_summary(conn, sid, "they talked about retries", 42)
    assert ("they talked about retries", 42) == session_store.summary(conn, sid)


def test_summary_of_a_fresh_session_is_empty(conn):
    assert ("", 0) == session_store.summary(conn, new_session(conn))


def test_claim_for_one_chat_takes_only_that_chats_head(conn):
    a1 = outbox_store.enqueue(conn, None, None, "cli", "a", "a1", "", "", T0)
    outbox_store.enqueue(conn, None, None, "cli", "a", "a2", "", "", T0)
    outbox_store.enqueue(conn, None, None, "cli", "b", "b1", "", "", T0)
    first = outbox_store.claim(conn, ["cli"], "w", 10, 30, T0, chats=["a"])
    again = outbox_store.claim(conn, ["cli"], "w", 10, 30, T0, chats=["a"])  # head held: nothing
    assert ([a1], []) == ([i.id for i in first], [i.id for i in again])


def test_an_unparked_turn_waits_for_the_sessions_running_turn(conn):
    sid = new_session(conn)
    first = user_turn(conn, sid, "delete my files")
    second = user_turn(conn, sid, "something else")
    turn_store.claim_next(conn, "w", 60, T0)
    turn_store.park(conn, first, "w")
    running = turn_store.claim_next(conn, "w", 60, T0)
    turn_store.unpark(conn, first)
    while_running = turn_store.claim_next(conn, "w2", 60, T0)
    turn_store.finish(conn, second, "w", True, "", T0)
    after = turn_store.claim_next(conn, "w2", 60, T0)
    assert (second, None, first) == (running.turn_id, while_running, after.turn_id)


def test_park_releases_the_session_and_unpark_puts_the_turn_ahead_again(conn):
    sid = new_session(conn)
    first = user_turn(conn, sid, "delete my files")
    second = user_turn(conn, sid, "/approve X")
    claim = turn_store.claim_next(conn, "w", 60, T0)
    parked = turn_store.park(conn, claim.turn_id, "w")
    next_claim = turn_store.claim_next(conn, "w", 60, T0)
    turn_store.finish(conn, second, "w", True, "", T0)
    unparked = turn_store.unpark(conn, first)
    resumed = turn_store.claim_next(conn, "w", 60, T0)
    assert (first, True, second, True, first) == (
        claim.turn_id, parked, next_claim.turn_id, unparked, resumed.turn_id)


def test_get_returns_the_new_session(conn):
    sid = new_session(conn, chat="c9", agent="main", instance="tg")
    expected = session_store.Session(sid, "main", "tg", "c9", "", "", "open", T0, T0, None)
    assert expected == session_store.get(conn, sid)


def test_get_of_an_unknown_session_returns_none(conn):
    assert session_store.get(conn, 12345) is None


def test_recent_lists_most_recently_active_first_up_to_limit(conn):
    a = new_session(conn, chat="a")
    b = new_session(conn, chat="b")
    c = new_session(conn, chat="c")
    session_store.touch(conn, a, T0 + 30)
    session_store.touch(conn, c, T0 + 20)
    session_store.touch(conn, b, T0 + 10)
    assert [a, c] == [s.id for s in session_store.recent(conn, limit=2)]


def test_count_counts_open_and_closed_sessions(conn):
    sid = new_session(conn, chat="a")
    new_session(conn, chat="b")
    session_store.close(conn, sid, "reset", T0 + 1)
    assert 2 == session_store.count(conn)


# --- turn_store ------------------------------------------------------------------------------


def test_add_user_turn_is_pending_with_no_attempts(conn):
    tid = user_turn(conn, new_session(conn), "hi there")
    turn = turn_store.get(conn, tid)
    assert ("user", "hi there", "alice", "pending", 0) == (
        turn.role,
        turn.content,
        turn.sender,
        turn.state,
        turn.attempts,
    )


def test_add_turn_is_not_work(conn):
    sid = new_session(conn)
    tid = turn_store.add_turn(conn, sid, "assistant", "an answer", '{"k": 1}', T0)
    turn = turn_store.get(conn, tid)
    assert ("assistant", "an answer", None, '{"k": 1}') == (turn.role, turn.content, turn.state, turn.meta)


def test_claim_next_never_takes_a_turn_that_is_not_work(conn):
    turn_store.add_turn(conn, new_session(conn), "assistant", "an answer", "{}", T0)
    assert turn_store.claim_next(conn, "w1", LEASE, T0) is None


def test_claim_next_on_an_empty_queue_returns_none(conn):
    assert turn_store.claim_next(conn, "w1", LEASE, T0) is None


def test_claim_next_returns_what_a_runner_needs(conn):
    sid = session_store.open_session(conn, "main", "tg", "chat-7", T0)
    tid = user_turn(conn, sid, "what time is it")
    expected = turn_store.Claim(tid, sid, "main", "tg", "chat-7", "alice", "what time is it", 1, T0 + LEASE, "m1")
    assert expected == turn_store.claim_next(conn, "w1", LEASE, T0)


def test_claim_next_marks_the_turn_claimed(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    assert "claimed" == turn_store.get(conn, tid).state


def test_claim_next_takes_a_sessions_turns_in_order(conn):
    sid = new_session(conn)
    ids = [user_turn(conn, sid, f"message {i}") for i in range(3)]
    taken = []
    for _ in ids:
        claim = turn_store.claim_next(conn, "w1", LEASE, T0)
        taken.append(claim.turn_id)
        turn_store.finish(conn, claim.turn_id, "w1", True, "", T0)
    assert ids == taken


def test_claim_next_holds_a_sessions_later_turns_while_its_head_is_claimed(conn):
    sid = new_session(conn)
    user_turn(conn, sid, "first")
    user_turn(conn, sid, "second")
    turn_store.claim_next(conn, "w1", LEASE, T0)
    assert turn_store.claim_next(conn, "w2", LEASE, T0) is None


def test_claim_next_gives_another_sessions_head_while_one_is_held(conn):
    a = new_session(conn, chat="a")
    b = new_session(conn, chat="b")
    user_turn(conn, a, "a1")
    user_turn(conn, a, "a2")
    b1 = user_turn(conn, b, "b1")
    turn_store.claim_next(conn, "w1", LEASE, T0)
    assert b1 == turn_store.claim_next(conn, "w2", LEASE, T0).turn_id


def test_claim_next_does_not_take_a_live_lease(conn):
    user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    assert turn_store.claim_next(conn, "w2", LEASE, T0 + LEASE - 0.001) is None


def test_claim_next_takes_an_expired_lease_again(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    claim = turn_store.claim_next(conn, "w2", LEASE, T0 + LEASE)
    assert (tid, 2) == (claim.turn_id, claim.attempt)


def test_a_retaken_turn_belongs_to_the_new_worker(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    turn_store.claim_next(conn, "w2", LEASE, T0 + LEASE)
    assert (False, True) == (
        turn_store.finish(conn, tid, "w1", True, "", T0 + LEASE + 1),
        turn_store.finish(conn, tid, "w2", True, "", T0 + LEASE + 1),
    )


def test_a_turn_that_exhausted_max_attempts_is_failed_and_skipped(conn):
    sid = new_session(conn)
    stuck = user_turn(conn, sid, "crashes every runner")
    after = user_turn(conn, sid, "next one")
    now = T0
    for _ in range(turn_store.MAX_ATTEMPTS):
        assert stuck == turn_store.claim_next(conn, "w", LEASE, now).turn_id
        now += LEASE
    claim = turn_store.claim_next(conn, "w", LEASE, now)
    turn = turn_store.get(conn, stuck)
    assert (after, "failed", turn_store.MAX_ATTEMPTS) == (claim.turn_id, turn.state, turn.attempts)


def test_a_turn_given_up_records_why(conn):
    stuck = user_turn(conn, new_session(conn))
    now = T0
    for _ in range(turn_store.MAX_ATTEMPTS + 1):
        turn_store.claim_next(conn, "w", LEASE, now)
        now += LEASE
    assert f"gave up after {turn_store.MAX_ATTEMPTS} attempts" == turn_store.get(conn, stuck).error


def test_renew_by_the_owner_returns_the_new_lease_end(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    assert T0 + 10 + LEASE == turn_store.renew(conn, tid, "w1", LEASE, T0 + 10)


def test_renew_keeps_the_turn_from_being_taken(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    turn_store.renew(conn, tid, "w1", LEASE, T0 + 20)
    assert turn_store.claim_next(conn, "w2", LEASE, T0 + LEASE + 1) is None


def test_renew_by_another_worker_returns_none(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    assert turn_store.renew(conn, tid, "w2", LEASE, T0 + 1) is None


def test_finish_ok_marks_the_turn_done(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    finished = turn_store.finish(conn, tid, "w1", True, "", T0 + 1)
    assert (True, "done") == (finished, turn_store.get(conn, tid).state)


def test_finish_not_ok_marks_the_turn_failed_with_its_error(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    turn_store.finish(conn, tid, "w1", False, "model timed out", T0 + 1)
    turn = turn_store.get(conn, tid)
    assert ("failed", "model timed out") == (turn.state, turn.error)


def test_finish_by_another_worker_returns_false_and_changes_nothing(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    finished = turn_store.finish(conn, tid, "w2", True, "", T0 + 1)
    assert (False, "claimed") == (finished, turn_store.get(conn, tid).state)


def test_finish_of_a_finished_turn_returns_false(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    turn_store.finish(conn, tid, "w1", True, "", T0 + 1)
    assert turn_store.finish(conn, tid, "w1", True, "", T0 + 2) is False


def test_release_by_the_owner_makes_the_turn_pending_without_spending_an_attempt(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    released = turn_store.release(conn, tid, "w1")
    turn = turn_store.get(conn, tid)
    assert (True, "pending", 0) == (released, turn.state, turn.attempts)


def test_a_released_turn_can_be_claimed_at_once(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    turn_store.release(conn, tid, "w1")
    assert tid == turn_store.claim_next(conn, "w2", LEASE, T0).turn_id


def test_release_by_another_worker_returns_false(conn):
    tid = user_turn(conn, new_session(conn))
    turn_store.claim_next(conn, "w1", LEASE, T0)
    assert turn_store.release(conn, tid, "w2") is False


def test_session_of_returns_the_turns_session(conn):
    sid = new_session(conn)
    assert sid == turn_store.session_of(conn, user_turn(conn, sid))


def test_session_of_an_unknown_turn_returns_none(conn):
    assert turn_store.session_of(conn, 999) is None


def test_get_of_an_unknown_turn_returns_none(conn):
    assert turn_store.get(conn, 999) is None


def test_history_returns_the_last_turns_up_to_one_oldest_first(conn):
    sid = new_session(conn)
    other = new_session(conn, chat="other")
    ids = [user_turn(conn, sid, f"m{i}") for i in range(5)]
    user_turn(conn, other, "not this session")
    assert ids[1:4] == [t.id for t in turn_store.history(conn, sid, up_to=ids[3], limit=3)]


def test_count_counts_every_turn(conn):
    sid = new_session(conn)
    user_turn(conn, sid)
    turn_store.add_turn(conn, sid, "assistant", "answer", "{}", T0)
    assert 2 == turn_store.count(conn)


def test_count_by_state_counts_only_work_turns(conn):
    sid = new_session(conn)
    user_turn(conn, sid, "one")
    user_turn(conn, sid, "two")
    turn_store.add_turn(conn, sid, "assistant", "answer", "{}", T0)
    turn_store.claim_next(conn, "w1", LEASE, T0)
    assert {"claimed": 1, "pending": 1} == turn_store.count_by_state(conn)


def test_insert_raw_adds_pending_user_turns(conn):
    sid = new_session(conn)
    turn_store.insert_raw(conn, [(sid, "a", "bob", T0), (sid, "b", "bob", T0 + 1)])
    assert {"pending": 2} == turn_store.count_by_state(conn)


# --- outbox_store ----------------------------------------------------------------------------


def claimed_ids(items: list[outbox_store.Item]) -> list[int]:
    return [item.id for item in items]


def test_enqueue_stores_a_pending_text_message(conn):
    oid = enqueue(conn, chat="c1", text="hello")
    row = outbox_store.get(conn, oid)
    assert ("tg", "c1", "text", "hello", "pending", 0) == (
        row.instance,
        row.chat,
        row.kind,
        row.body,
        row.state,
        row.attempts,
    )


def test_enqueue_with_a_file_path_is_a_file_message(conn):
    oid = outbox_store.enqueue(conn, None, None, "tg", "c1", "caption", "/data/out/report.pdf", "", T0)
    row = outbox_store.get(conn, oid)
    assert ("file", "/data/out/report.pdf") == (row.kind, row.file_path)


def test_claim_returns_what_a_gateway_needs(conn):
    sid = new_session(conn)
    tid = user_turn(conn, sid)
    oid = outbox_store.enqueue(conn, sid, tid, "tg", "c1", "answer", "", "m1", T0)
    expected = outbox_store.Item(oid, "tg", "c1", "text", "answer", "", "m1", 1, sid, 0, T0, turn_id=tid)
    assert [expected] == outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)


def test_progress_is_kept_for_the_next_holder(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    assert not outbox_store.progress(conn, oid, "g2", 2, "m7")  # only the holder records progress
    assert outbox_store.progress(conn, oid, "g1", 2, "m7")
    taken = outbox_store.claim(conn, ["tg"], "g2", 10, LEASE, T0 + LEASE + 1)  # g1's lease ran out
    assert [(oid, 2, 2)] == [(i.id, i.parts_sent, i.attempt) for i in taken]


def test_claim_reports_session_zero_for_a_message_without_session(conn):
    enqueue(conn)
    assert 0 == outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)[0].session_id


def test_claim_returns_only_the_head_of_each_chat(conn):
    a1 = enqueue(conn, chat="a")
    enqueue(conn, chat="a")
    b1 = enqueue(conn, chat="b")
    enqueue(conn, chat="b")
    assert [a1, b1] == claimed_ids(outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0))


def test_claim_holds_a_chats_next_message_while_its_head_is_claimed(conn):
    enqueue(conn, chat="a")
    enqueue(conn, chat="a")
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    assert [] == outbox_store.claim(conn, ["tg"], "g2", 10, LEASE, T0)


def test_claim_returns_a_chats_next_message_once_its_head_is_sent(conn):
    a1 = enqueue(conn, chat="a")
    a2 = enqueue(conn, chat="a")
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.mark_sent(conn, a1, "g1", "p1", T0 + 1)
    assert [a2] == claimed_ids(outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0 + 1))


def test_claim_honours_the_limit(conn):
    ids = [enqueue(conn, chat=f"c{i}") for i in range(5)]
    assert ids[:2] == claimed_ids(outbox_store.claim(conn, ["tg"], "g1", 2, LEASE, T0))


def test_claim_limit_counts_across_instances(conn):
    t1 = enqueue(conn, instance="tg", chat="a")
    enqueue(conn, instance="slack", chat="a")
    assert [t1] == claimed_ids(outbox_store.claim(conn, ["tg", "slack"], "g1", 1, LEASE, T0))


def test_claim_serves_several_instances(conn):
    t1 = enqueue(conn, instance="tg", chat="a")
    s1 = enqueue(conn, instance="slack", chat="a")
    assert [t1, s1] == claimed_ids(outbox_store.claim(conn, ["tg", "slack"], "g1", 10, LEASE, T0))


def test_claim_leaves_other_instances_alone(conn):
    enqueue(conn, instance="slack", chat="a")
    assert [] == outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)


def test_claim_treats_the_same_chat_on_two_instances_as_two_queues(conn):
    enqueue(conn, instance="tg", chat="same")
    s1 = enqueue(conn, instance="slack", chat="same")
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    assert [s1] == claimed_ids(outbox_store.claim(conn, ["slack"], "g2", 10, LEASE, T0))


def test_claim_takes_an_expired_lease_again(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    items = outbox_store.claim(conn, ["tg"], "g2", 10, LEASE, T0 + LEASE)
    assert [(oid, 2)] == [(item.id, item.attempt) for item in items]


def test_claim_does_not_take_a_live_lease(conn):
    enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    assert [] == outbox_store.claim(conn, ["tg"], "g2", 10, LEASE, T0 + LEASE - 0.001)


def test_mark_failed_with_retry_waits_until_not_before(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.mark_failed(conn, oid, "g1", "429", 60.0, T0 + 1)
    assert [] == outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0 + 60.5)


def test_mark_failed_with_retry_is_claimable_at_not_before(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.mark_failed(conn, oid, "g1", "429", 60.0, T0 + 1)
    items = outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0 + 61)
    assert [(oid, 2)] == [(item.id, item.attempt) for item in items]


def test_mark_failed_with_retry_keeps_the_chat_in_order(conn):
    oid = enqueue(conn, chat="a")
    enqueue(conn, chat="a")
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.mark_failed(conn, oid, "g1", "429", 60.0, T0 + 1)
    assert [] == outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0 + 2)


def test_mark_failed_with_retry_records_the_error_and_pending_state(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    marked = outbox_store.mark_failed(conn, oid, "g1", "429 too many requests", 60.0, T0 + 1)
    row = outbox_store.get(conn, oid)
    assert (True, "pending", "429 too many requests") == (marked, row.state, row.error)


def test_mark_failed_with_negative_retry_fails_for_good(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.mark_failed(conn, oid, "g1", "chat not found", -1, T0 + 1)
    later = outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0 + 10_000)
    assert ("failed", []) == (outbox_store.get(conn, oid).state, later)


def test_a_permanently_failed_head_lets_the_chat_move_on(conn):
    a1 = enqueue(conn, chat="a")
    a2 = enqueue(conn, chat="a")
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.mark_failed(conn, a1, "g1", "too long", -1, T0 + 1)
    assert [a2] == claimed_ids(outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0 + 1))


def test_mark_failed_by_another_worker_returns_false(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    assert outbox_store.mark_failed(conn, oid, "g2", "boom", 5.0, T0 + 1) is False


def test_mark_sent_records_the_platform_id_and_time(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    sent = outbox_store.mark_sent(conn, oid, "g1", "tg-msg-77", T0 + 2)
    row = outbox_store.get(conn, oid)
    assert (True, "sent", "tg-msg-77", T0 + 2) == (sent, row.state, row.platform_msg_id, row.sent_at)


def test_mark_sent_by_another_worker_returns_false_and_changes_nothing(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    sent = outbox_store.mark_sent(conn, oid, "g2", "tg-msg-77", T0 + 2)
    assert (False, "claimed") == (sent, outbox_store.get(conn, oid).state)


def test_mark_sent_by_a_worker_whose_lease_was_taken_returns_false(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.claim(conn, ["tg"], "g2", 10, LEASE, T0 + LEASE)
    assert outbox_store.mark_sent(conn, oid, "g1", "late", T0 + LEASE + 1) is False


def test_outbox_renew_by_the_owner_returns_the_new_lease_end(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    assert T0 + 5 + LEASE == outbox_store.renew(conn, oid, "g1", LEASE, T0 + 5)


def test_outbox_renew_by_another_worker_returns_none(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    assert outbox_store.renew(conn, oid, "g2", LEASE, T0 + 5) is None


def test_outbox_release_makes_the_row_pending_without_spending_an_attempt(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    released = outbox_store.release(conn, oid, "g1")
    row = outbox_store.get(conn, oid)
    assert (True, "pending", 0) == (released, row.state, row.attempts)


def test_outbox_release_by_another_worker_returns_false(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    assert outbox_store.release(conn, oid, "g2") is False


def test_outbox_get_of_an_unknown_row_returns_none(conn):
    assert outbox_store.get(conn, 404) is None


def test_for_chat_lists_one_chats_rows_in_order(conn):
    a1 = enqueue(conn, chat="a")
    enqueue(conn, chat="b")
    a2 = enqueue(conn, chat="a")
    enqueue(conn, instance="slack", chat="a")
    assert [a1, a2] == [row.id for row in outbox_store.for_chat(conn, "tg", "a")]


def test_outbox_count_by_state(conn):
    first = enqueue(conn, chat="a")
    enqueue(conn, chat="b")
    enqueue(conn, chat="a")
    outbox_store.claim(conn, ["tg"], "g1", 1, LEASE, T0)
    outbox_store.mark_sent(conn, first, "g1", "p", T0)
    outbox_store.claim(conn, ["tg"], "g1", 1, LEASE, T0)
    assert {"sent": 1, "claimed": 1, "pending": 1} == outbox_store.count_by_state(conn)


# --- keys_store ------------------------------------------------------------------------------


def test_answer_of_an_unknown_key_is_none(conn):
    assert keys_store.answer(conn, "req-1") is None


def test_remember_answer_then_answer_returns_it(conn):
    keys_store.remember_answer(conn, "req-1", b"\x01first", T0)
    assert b"\x01first" == keys_store.answer(conn, "req-1")


def test_remember_answer_refuses_a_second_answer_for_a_key(conn):
    keys_store.remember_answer(conn, "req-1", b"first", T0)
    with pytest.raises(apsw.ConstraintError):
        keys_store.remember_answer(conn, "req-1", b"second", T0 + 1)


def test_prune_answers_removes_only_older_answers(conn):
    keys_store.remember_answer(conn, "old", b"o", T0)
    keys_store.remember_answer(conn, "new", b"n", T0 + 100)
    removed = keys_store.prune_answers(conn, T0 + 50, 1000)
    assert (1, None, b"n") == (removed, keys_store.answer(conn, "old"), keys_store.answer(conn, "new"))


def test_prune_answers_removes_at_most_limit_oldest_first(conn):
    for i in range(5):
        keys_store.remember_answer(conn, f"k{i}", b"x", T0 + i)
    removed = keys_store.prune_answers(conn, T0 + 100, 2)
    left = [k for k in ("k0", "k1", "k2", "k3", "k4") if keys_store.answer(conn, k) is not None]
    assert (2, ["k2", "k3", "k4"]) == (removed, left)


def test_inbound_turn_of_new_keys_is_none(conn):
    assert keys_store.inbound_turn(conn, ["tg:update:1", "tg:msg:c1:5"]) is None


def test_inbound_turn_finds_the_turn_by_any_of_its_keys(conn):
    keys_store.remember_inbound(conn, ["tg:update:1", "tg:msg:c1:5"], 42, T0)
    assert (42, 42) == (
        keys_store.inbound_turn(conn, ["tg:update:9", "tg:msg:c1:5"]),
        keys_store.inbound_turn(conn, ["tg:update:1"]),
    )


def test_remember_inbound_keeps_the_first_turn_of_a_key(conn):
    keys_store.remember_inbound(conn, ["k"], 1, T0)
    keys_store.remember_inbound(conn, ["k"], 2, T0 + 1)
    assert 1 == keys_store.inbound_turn(conn, ["k"])


def test_prune_inbound_removes_only_older_keys(conn):
    keys_store.remember_inbound(conn, ["old"], 1, T0)
    keys_store.remember_inbound(conn, ["new"], 2, T0 + 100)
    removed = keys_store.prune_inbound(conn, T0 + 50, 1000)
    assert (1, None, 2) == (
        removed,
        keys_store.inbound_turn(conn, ["old"]),
        keys_store.inbound_turn(conn, ["new"]),
    )


def test_prune_inbound_removes_at_most_limit(conn):
    keys_store.remember_inbound(conn, [f"k{i}" for i in range(5)], 1, T0)
    assert 3 == keys_store.prune_inbound(conn, T0 + 1, 3)


# --- beat_store ------------------------------------------------------------------------------


def test_record_then_all_beats_returns_the_beat(conn):
    beat_store.record(conn, "writer", 100, "ok", "", T0)
    assert [beat_store.Beat("writer", 100, "ok", "", T0, T0, 1)] == beat_store.all_beats(conn)


def test_record_with_the_same_pid_keeps_started_at(conn):
    beat_store.record(conn, "writer", 100, "starting", "", T0)
    beat_store.record(conn, "writer", 100, "ok", "queue 3", T0 + 10)
    assert [beat_store.Beat("writer", 100, "ok", "queue 3", T0, T0 + 10, 1)] == beat_store.all_beats(conn)


def test_record_with_a_new_pid_resets_started_at(conn):
    beat_store.record(conn, "writer", 100, "ok", "", T0)
    beat_store.record(conn, "writer", 200, "starting", "", T0 + 10)
    assert [beat_store.Beat("writer", 200, "starting", "", T0 + 10, T0 + 10, 2)] == beat_store.all_beats(conn)


def test_all_beats_lists_services_by_name(conn):
    beat_store.record(conn, "writer", 1, "ok", "", T0)
    beat_store.record(conn, "runner", 2, "ok", "", T0)
    beat_store.record(conn, "gateway-telegram", 3, "ok", "", T0)
    assert ["gateway-telegram", "runner", "writer"] == [b.service for b in beat_store.all_beats(conn)]


# --- recall_store ----------------------------------------------------------------------------


def test_quote_query_quotes_each_word_and_drops_punctuation():
    assert '"retry" "NOT" "x" "AND" "y"' == recall_store.quote_query('retry NOT "x" AND (y*)')


def test_quote_query_of_punctuation_only_is_empty():
    assert "" == recall_store.quote_query(' "*^:()-+ ')


def test_search_of_an_empty_query_returns_nothing(conn):
    user_turn(conn, new_session(conn), "anything")
    assert [] == recall_store.search(conn, "?!")


def recall_corpus(conn: apsw.Connection) -> dict[str, int]:
    sid = new_session(conn)
    texts = [
        "I will retry later",
        "the retries failed",
        "it retried twice",
        "the weather is fine today",
        "please water the plants",
    ]
    return {text: user_turn(conn, sid, text) for text in texts}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=40))
def test_search_never_raises_on_arbitrary_text(conn, text):
    if not turn_store.count(conn):
        recall_corpus(conn)
    assert isinstance(recall_store.search(conn, text), list)


FTS_SYNTAX = ['"', "*", "^", ":", "(", ")", "-", "+", "{", "}", ",", " ", "a", "NEAR", "AND", "OR", "NOT"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.lists(
        st.sampled_from(FTS_SYNTAX),
        max_size=12,
    ).map("".join)
)
def test_search_never_raises_on_fts_operators(conn, text):
    if not turn_store.count(conn):
        recall_corpus(conn)
    assert isinstance(recall_store.search(conn, text), list)


def test_search_finds_stemmed_forms(conn):
    ids = recall_corpus(conn)
    expected = {ids["I will retry later"], ids["the retries failed"], ids["it retried twice"]}
    assert expected == {hit.turn_id for hit in recall_store.search(conn, "retry")}


def test_search_requires_every_word(conn):
    ids = recall_corpus(conn)
    assert [ids["the retries failed"]] == [hit.turn_id for hit in recall_store.search(conn, "retry failed")]


def test_search_returns_the_turn_behind_a_hit(conn):
    sid = new_session(conn)
    tid = turn_store.add_turn(conn, sid, "assistant", "the deploy finished", "{}", T0 + 3)
    hit = recall_store.search(conn, "deploy")[0]
    assert (tid, sid, "assistant", "the deploy finished", T0 + 3) == hit[:5]


def test_search_ranks_the_turn_with_more_occurrences_first(conn):
    sid = new_session(conn)
    once = user_turn(conn, sid, "backup one two three four")
    thrice = user_turn(conn, sid, "backup backup backup four five")
    assert [thrice, once] == [hit.turn_id for hit in recall_store.search(conn, "backup")]


def test_search_honours_the_limit(conn):
    sid = new_session(conn)
    for i in range(5):
        user_turn(conn, sid, f"note number {i}")
    assert 2 == len(recall_store.search(conn, "note", limit=2))


def test_search_filters_by_agent(conn):
    mine = user_turn(conn, new_session(conn, agent="main"), "the invoice is due")
    user_turn(conn, new_session(conn, agent="other"), "the invoice is paid")
    assert [mine] == [hit.turn_id for hit in recall_store.search(conn, "invoice", agent="main")]


def test_search_of_an_unknown_agent_finds_nothing(conn):
    user_turn(conn, new_session(conn, agent="main"), "the invoice is due")
    assert [] == recall_store.search(conn, "invoice", agent="nobody")


def test_rebuild_keeps_the_same_results(conn):
    recall_corpus(conn)
    before = recall_store.search(conn, "retry")
    recall_store.rebuild(conn)
    assert before == recall_store.search(conn, "retry")


def test_needs_backfill_is_false_on_an_empty_database(conn):
    assert recall_store.needs_backfill(conn) is False


def test_needs_backfill_is_false_when_triggers_indexed_every_turn(conn):
    recall_corpus(conn)
    turn_store.insert_raw(conn, [(new_session(conn, chat="bulk"), "bulk row", "bob", T0)])
    assert recall_store.needs_backfill(conn) is False


def test_needs_backfill_is_true_after_the_index_was_cleared(conn):
    recall_corpus(conn)
    recall_store.clear(conn)
    assert (True, []) == (recall_store.needs_backfill(conn), recall_store.search(conn, "retry"))


def test_rebuild_after_clear_finds_the_turns_again(conn):
    recall_corpus(conn)
    before = recall_store.search(conn, "retry")
    recall_store.clear(conn)
    recall_store.rebuild(conn)
    assert (False, before) == (recall_store.needs_backfill(conn), recall_store.search(conn, "retry"))


# --- db_store and common.db ------------------------------------------------------------------


def test_writer_settings_are_wal_full_sync_and_foreign_keys(conn):
    assert {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1} == db_store.settings(conn)


def test_reader_settings_see_wal_and_foreign_keys(conn, db_file):
    reader = db.open_reader(db_file)
    try:
        found = db_store.settings(reader)
    finally:
        reader.close()
    assert ("wal", 1) == (found["journal_mode"], found["foreign_keys"])


def test_integrity_check_of_a_sound_file_is_ok(conn):
    recall_corpus(conn)
    assert ["ok"] == db_store.integrity_check(conn)


def test_quick_integrity_check_of_a_sound_file_is_ok(conn):
    assert ["ok"] == db_store.integrity_check(conn, quick=True)


def test_checkpoint_returns_busy_wal_pages_and_pages_done(conn):
    recall_corpus(conn)
    busy, log, done = db_store.checkpoint(conn, "passive")
    assert (0, True, log) == (busy, log > 0, done)


def test_checkpoint_truncate_is_accepted(conn):
    assert 3 == len(db_store.checkpoint(conn, "TRUNCATE"))


def test_checkpoint_rejects_an_unknown_mode(conn):
    with pytest.raises(ValueError):
        db_store.checkpoint(conn, "sometimes")


def test_size_bytes_is_positive(conn):
    assert db_store.size_bytes(conn) > 0


def test_begin_commit_keeps_the_writes(conn):
    db_store.begin(conn)
    new_session(conn)
    db_store.commit(conn)
    assert (1, False) == (session_store.count(conn), conn.in_transaction)


def test_begin_rollback_undoes_the_writes(conn):
    db_store.begin(conn)
    new_session(conn)
    db_store.rollback(conn)
    assert 0 == session_store.count(conn)


def test_rollback_outside_a_transaction_does_nothing(conn):
    db_store.rollback(conn)
    assert conn.in_transaction is False


def test_rollback_to_undoes_one_request_and_keeps_the_batch(conn):
    db_store.begin(conn)
    new_session(conn, chat="kept")
    db_store.savepoint(conn)
    new_session(conn, chat="undone")
    db_store.rollback_to(conn)
    db_store.commit(conn)
    assert ["kept"] == [s.chat for s in session_store.recent(conn)]


def test_release_keeps_the_request(conn):
    db_store.begin(conn)
    db_store.savepoint(conn)
    new_session(conn)
    db_store.release(conn)
    db_store.commit(conn)
    assert 1 == session_store.count(conn)


def test_read_tx_reads_one_snapshot(conn, db_file):
    reader = db.open_reader(db_file)
    try:
        with db.read_tx(reader):
            before = session_store.count(reader)
            new_session(conn)
            during = session_store.count(reader)
        after = session_store.count(reader)
    finally:
        reader.close()
    assert (0, 0, 1) == (before, during, after)


def test_read_tx_ends_its_transaction_on_error(conn, db_file):
    reader = db.open_reader(db_file)
    try:
        with pytest.raises(KeyError):
            with db.read_tx(reader):
                raise KeyError("boom")
        open_after = reader.in_transaction
    finally:
        reader.close()
    assert open_after is False


def test_begin_read_starts_a_transaction(conn, db_file):
    reader = db.open_reader(db_file)
    try:
        db_store.begin_read(reader)
        started = reader.in_transaction
        db_store.rollback(reader)
    finally:
        reader.close()
    assert started is True


def test_configure_reader_makes_a_connection_query_only(conn, db_file):
    other = apsw.Connection(str(db_file))
    try:
        db_store.configure_reader(other, 100)
        with pytest.raises(apsw.ReadOnlyError):
            new_session(other)
    finally:
        other.close()


def test_configure_writer_turns_on_wal_full_sync_and_foreign_keys(tmp_path):
    other = apsw.Connection(str(tmp_path / "plain.db"))
    try:
        db_store.configure_writer(other, 100)
        found = db_store.settings(other)
    finally:
        other.close()
    assert {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1} == found


def test_delivery_status_only_moves_forward(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.mark_sent(conn, oid, "g1", "wamid.1", T0)
    seen = []
    for status in ("delivered", "sent", "read", "delivered", "failed"):  # out of order, as platforms send them
        outbox_store.record_delivery(conn, "tg", "wamid.1", status, "131026 undeliverable" if status == "failed" else "")
        seen.append(outbox_store.delivery_of(conn, "tg", "wamid.1")[0])
    assert ["delivered", "delivered", "read", "read", "read"] == seen
    assert not outbox_store.record_delivery(conn, "other", "wamid.1", "failed", "x")  # another instance's id


def test_a_failed_delivery_keeps_its_reason(conn):
    oid = enqueue(conn)
    outbox_store.claim(conn, ["tg"], "g1", 10, LEASE, T0)
    outbox_store.mark_sent(conn, oid, "g1", "wamid.2", T0)
    outbox_store.record_delivery(conn, "tg", "wamid.2", "sent", "")
    outbox_store.record_delivery(conn, "tg", "wamid.2", "failed", "131026 undeliverable")
    assert ("failed", "131026 undeliverable") == outbox_store.delivery_of(conn, "tg", "wamid.2")
