"""Consecutive inbound messages of a group commit stored together (services/writer/inbound_ops.store_run):
the same turns, keys, sessions, answers and events as storing each alone (store_one, the savepoint pass)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from common import db
from common.stores import keys_store, recall_store, session_store, turn_store
from schema import messages as m
from services.writer import group_commit

T0 = 1_700_000_000.0


class Log:
    def error(self, event: str, **kw) -> None:
        raise AssertionError(f"logged {event} {kw}")


@pytest.fixture
def open_copy(tmp_path: Path, migrated_file: Path):
    conns = []

    def make(name: str):
        path = tmp_path / f"{name}.db"
        shutil.copyfile(migrated_file, path)
        conns.append(db.open_writer(path))
        return conns[-1]

    yield make
    for c in conns:
        c.close()


def inbound(chat: str, text: str, *keys: str, chat_kind: str = "private") -> m.Inbound:
    return m.Inbound(agent="default", instance="test", chat=chat, sender="u1", text=text, chat_kind=chat_kind,
                     dedupe_keys=list(keys))


def items(ops: list[m.Inbound], first_id: int = 0) -> list[group_commit.Item]:
    return [(b"client", m.Request(id=first_id + i, key=f"client:{first_id + i}", op=op)) for i, op in enumerate(ops)]


# Three chats interleaved, a platform retry within the batch, one of a message stored by an earlier batch,
# a message with two event ids of which the second came before, and a key repeated within one message.
EARLIER = [inbound("a", "stored before", "k:old")]
BATCH = [
    inbound("a", "one", "k:1"),
    inbound("b", "two", "k:2"),
    inbound("a", "three", "k:3", "k:3"),
    inbound("b", "two again", "k:2"),
    inbound("c", "old again", "k:old"),
    inbound("c", "four", "k:4"),
    inbound("a", "five, also known as one", "k:5", "k:1"),
    inbound("c", "six", "k:6"),
]


def dump(conn, chats: str = "abc") -> dict:
    keys = [key for op in EARLIER + BATCH for key in op.dedupe_keys]
    with db.read_tx(conn):
        return {
            "turns": [turn for chat in chats for turn in turn_store.user_turns_for_chat(conn, "test", chat)],
            "keys": keys_store.inbound_turns(conn, json.dumps(keys)),
            "sessions": session_store.recent(conn),
            "fts": sorted(hit.turn_id for word in ("one", "two", "six") for hit in recall_store.search(conn, word)),
        }


def test_a_run_stores_what_one_at_a_time_stores(open_copy):
    together, alone = open_copy("together"), open_copy("alone")
    for conn in (together, alone):
        group_commit.commit(conn, items(EARLIER, 100), T0 - 60, Log())

    run = group_commit.commit(together, items(BATCH), T0, Log())
    # a refusal at the end sends the whole batch through the savepoint pass: store_one for each
    refused = m.FinishTurn(turn_id=10**9, worker="nobody")
    single = group_commit.commit(alone, items(BATCH) + [(b"client", m.Request(id=99, key="c:99", op=refused))],
                                 T0, Log())

    assert (False, True) == (run.retried, single.retried)
    assert [a for _, a in run.acks] == [a for _, a in single.acks][:-1]
    assert run.events == single.events
    assert dump(together) == dump(alone)
    answers = [a.result for _, a in run.acks]
    assert [False, False, False, True, True, False, True, False] == [a.duplicate for a in answers]
    assert answers[3].turn_id == answers[1].turn_id and answers[6].turn_id == answers[0].turn_id
    assert (1, answers[0].session_id) == (answers[4].turn_id, answers[4].session_id)  # the earlier batch's


def test_a_run_takes_consecutive_ids_and_tells_each_new_turn(open_copy):
    conn = open_copy("ids")
    applied = group_commit.commit(conn, items([inbound("x", f"m{i}", f"x:{i}") for i in range(50)]), T0, Log())
    ids = [a.result.turn_id for _, a in applied.acks]
    assert list(range(ids[0], ids[0] + 50)) == ids
    assert [(m.TOPIC_TURN, i) for i in ids] == [(topic, f["turn_id"]) for topic, _cls, f in applied.events]


def test_a_refused_message_in_a_run_fails_alone(open_copy):
    conn = open_copy("refused")
    batch = [inbound("r", "first", "r:1"), inbound("r", "bad", "r:2", chat_kind="supergroup"),
             inbound("r", "no key"), inbound("r", "third", "r:3")]
    applied = group_commit.commit(conn, items(batch), T0, Log())
    acks = [a for _, a in applied.acks]
    assert [True, False, False, True] == [a.ok for a in acks]
    assert ["invalid", "invalid"] == [acks[1].code, acks[2].code]
    assert ["first", "third"] == [turn.content for turn in dump(conn, "r")["turns"]]
