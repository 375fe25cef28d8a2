"""One group commit against a real SQLite file (services/writer/group_commit.py): no savepoints while every
request succeeds; a batch holding a failure is applied again with savepoints, so the failing request alone
gets its error and the others commit once; replays return the first answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import apsw
import pytest

from common import db
from common.stores import db_store, outbox_store, turn_store
from schema import messages as m
from services.writer import group_commit

T0 = 1_700_000_000.0


class Log:
    def __init__(self) -> None:
        self.errors: list[tuple[str, dict]] = []

    def error(self, event: str, **kw) -> None:
        self.errors.append((event, kw))


@pytest.fixture
def conn(tmp_path: Path, migrated_file: Path):
    path = tmp_path / "starling.db"
    shutil.copyfile(migrated_file, path)
    c = db.open_writer(path)
    yield c
    c.close()


class Statements:
    """Every statement the connection runs, as SQLite is given it."""

    def __init__(self, conn: apsw.Connection) -> None:
        self.seen: list[str] = []
        conn.exec_trace = self._trace

    def _trace(self, _cursor, statement: str, _bindings) -> bool:
        self.seen.append(statement)
        return True

    def count(self, statement: str) -> int:
        return sum(1 for s in self.seen if s == statement)


def inbound(chat: str, n: int) -> m.Inbound:
    return m.Inbound(agent="default", instance="test", chat=chat, sender="u1", text=f"{chat} #{n}",
                     dedupe_keys=[f"test:{chat}:{n}"])


def request(n: int, op: m.WriteOp, key: str = "") -> group_commit.Item:
    return (b"client", m.Request(id=n, key=key or f"client:{n}", op=op))


def commit(conn, work, log=None, **kw) -> group_commit.Applied:
    return group_commit.commit(conn, work, T0, log or Log(), **kw)


def test_a_batch_without_a_failure_commits_without_savepoints(conn):
    trace = Statements(conn)
    applied = commit(conn, [request(i, inbound("a", i)) for i in range(20)])
    assert (False, 20, 0, 1) == (applied.retried, sum(a.ok for _, a in applied.acks),
                                 trace.count(db_store.SAVEPOINT), trace.count(db_store.COMMIT))
    assert 20 == turn_store.count(conn)


def mixed_batch(claim: m.TurnClaim) -> list[group_commit.Item]:
    """Inbound writes, keyed writes (a claim, an append), and in the middle a request that writes a row and
    then fails (its second reply is empty): what it wrote must not survive."""
    work = [request(i, inbound("b", i)) for i in range(10)]
    work.append(request(10, m.AppendTurn(session_id=claim.session_id, worker="r1", role="assistant",
                                         content="thinking", parent_turn_id=claim.turn_id), key="r1:append:1"))
    work.append(request(11, m.EnqueueOutbox(instance="test", chat="b", replies=[m.Reply(text="first"), m.Reply()])))
    work.append(request(12, m.ClaimTurn(worker="r2"), key="r2:claim:1"))
    work += [request(i, inbound("b", i)) for i in range(13, 20)]
    return work


def test_one_failing_request_gets_its_error_and_the_rest_commit_once(conn):
    commit(conn, [request(100, inbound("first", 0))])
    claim = commit(conn, [request(101, m.ClaimTurn(worker="r1"))]).acks[0][1].result
    trace = Statements(conn)

    applied = commit(conn, mixed_batch(claim))

    acks = {ack.id: ack for _, ack in applied.acks}
    assert (True, 20, [11]) == (applied.retried, len(acks), [i for i, a in acks.items() if not a.ok])
    assert ("invalid", "a reply needs text or a file") == (acks[11].code, acks[11].error)
    assert 1 == trace.count(db_store.COMMIT)  # one transaction stored the batch
    assert 1 == trace.count(db_store.ROLLBACK)  # the first pass, undone whole
    assert 20 == trace.count(db_store.SAVEPOINT)  # the second: each request in its own
    # every other request once: 1 + 17 user turns, the appended turn; no outbox row of the failed request
    assert 1 + 17 + 1 == turn_store.count(conn)
    assert [] == outbox_store.for_chat(conn, "test", "b")
    assert 17 == len(turn_store.user_turns_for_chat(conn, "test", "b"))
    assert isinstance(acks[12].result, m.TurnClaim)


def test_replays_of_a_retried_batch_return_the_first_answers(conn):
    commit(conn, [request(100, inbound("first", 0))])
    claim = commit(conn, [request(101, m.ClaimTurn(worker="r1"))]).acks[0][1].result
    first = {ack.id: ack for _, ack in commit(conn, mixed_batch(claim)).acks}
    stored = turn_store.count(conn)

    again = {ack.id: ack for _, ack in commit(conn, mixed_batch(claim)).acks}

    assert first[10] == again[10]  # the append's answer: the same turn id, not a second turn
    assert first[12] == again[12]  # the claim's: the same turn, not the next one
    assert [True] * 17 == [again[i].result.duplicate for i in (*range(10), *range(13, 20))]
    assert [first[i].result.turn_id for i in range(10)] == [again[i].result.turn_id for i in range(10)]
    assert (False, "invalid") == (again[11].ok, again[11].code)  # a failure is not remembered: it fails again
    assert stored == turn_store.count(conn)


def test_a_refusal_is_not_logged_as_an_error_and_its_events_are_dropped(conn):
    log = Log()
    work = [request(1, inbound("c", 1)),
            request(2, m.SetSummary(session_id=1, summary="s", upto_turn_id=2**63 - 1)),
            request(3, m.FinishTurn(turn_id=10**9, worker="nobody"))]
    applied = commit(conn, work, log)
    assert [True, True, False] == [a.ok for _, a in applied.acks]
    assert ("not_found", []) == (applied.acks[2][1].code, log.errors)  # a refusal is not an error of ours
    assert [(m.TOPIC_TURN, 1)] == [(topic, f["session_id"]) for topic, _cls, f in applied.events]


def test_requests_that_arrive_during_the_batch_join_it_up_to_the_limit(conn):
    arriving = [[request(i, inbound("d", i)) for i in range(5, 9)], [request(i, inbound("d", i)) for i in range(9, 30)]]
    asked: list[int] = []

    def more(room: int) -> list[group_commit.Item]:
        asked.append(room)
        return arriving.pop(0)[:room] if arriving else []

    trace = Statements(conn)
    work = [request(i, inbound("d", i)) for i in range(5)]
    applied = commit(conn, work, more=more, limit=12)
    assert ([7, 3], 12, 12, 1) == (asked, len(work), len(applied.acks), trace.count(db_store.COMMIT))
    assert [f"d #{i}" for i in range(12)] == [t.content for t in turn_store.user_turns_for_chat(conn, "test", "d")]


def test_a_failure_among_the_joining_requests_retries_the_whole_batch(conn):
    joining = [request(3, m.FinishTurn(turn_id=10**9, worker="nobody")), request(4, inbound("e", 4))]
    work = [request(i, inbound("e", i)) for i in range(3)]
    applied = commit(conn, work, more=lambda room: [joining.pop(0)] if joining else [], limit=10)
    # no more join once one failed: the next request waits for the next commit
    assert (True, [0, 1, 2, 3], [True, True, True, False]) == (
        applied.retried, [a.id for _, a in applied.acks], [a.ok for _, a in applied.acks])
    assert 3 == turn_store.count(conn)
