"""`starling session list|search|show` over a database a real writer filled."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from common.cli import session_cmd
from common.cli.main import main
from schema import messages as m
from tests.procs import make_home, remove_home


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def inbound(agent: str, chat: str, text: str) -> m.Inbound:
    return m.Inbound(agent=agent, instance="test", chat=chat, sender="u1", text=text, dedupe_keys=[uuid.uuid4().hex])


@pytest.fixture(scope="module")
def filled(writer_home) -> dict[str, int]:
    """Two sessions of agent default and one of agent helper; returns their ids by name."""

    async def fill() -> dict[str, int]:
        async with writer_home.client() as c:
            garden = await c.call(inbound("default", "garden", "when should I water the tomatoes"))
            claim = await c.call(m.ClaimTurn(worker="w"))
            assert claim.turn_id == garden.turn_id
            await c.call(m.FinishTurn(turn_id=claim.turn_id, worker="w",
                                      answer="Water tomatoes early in the morning, twice a week."))
            await c.call(inbound("default", "garden", "and the basil?"))
            travel = await c.call(inbound("default", "travel", "book a train to Lisbon"))
            helper = await c.call(inbound("helper", "desk", "tomatoes are on the shopping list"))
            return {"garden": garden.session_id, "travel": travel.session_id, "helper": helper.session_id}

    return asyncio.run(asyncio.wait_for(fill(), 30))


def home_args(writer_home) -> list[str]:
    return ["--home", str(writer_home.root)]


def test_list_shows_sessions_most_recent_first_with_turn_counts(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "list", "--json")
    rows = [(r["id"], r["agent"], r["chat"], r["turns"]) for r in json.loads(out)]
    expected = [(filled["helper"], "helper", "desk", 1), (filled["travel"], "default", "travel", 1),
                (filled["garden"], "default", "garden", 3)]
    assert expected == rows


def test_list_limit_caps_the_rows(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "list", "--limit", "1", "--json")
    assert [filled["helper"]] == [r["id"] for r in json.loads(out)]


def test_list_table_has_a_row_per_session(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "list")
    lines = out.splitlines()
    headers = ["ID", "AGENT", "INSTANCE", "CHAT", "STATE", "TURNS", "LAST", "ACTIVE"]
    assert (headers, 4) == (lines[0].split(), len(lines))


def test_search_finds_stemmed_words_across_sessions(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "search", "tomato", "--json")
    assert {filled["garden"], filled["helper"]} == {hit["session_id"] for hit in json.loads(out)}


def test_search_is_ranked_by_bm25(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "search", "tomatoes", "--json")
    ranks = [hit["rank"] for hit in json.loads(out)]
    assert sorted(ranks) == ranks


def test_search_filters_by_agent(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "search", "tomatoes", "--agent", "helper", "--json")
    assert [(filled["helper"], "user")] == [(h["session_id"], h["role"]) for h in json.loads(out)]


def test_search_table_shows_session_turn_role_and_snippet(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "search", "Lisbon")
    row = out.splitlines()[1].split()
    assert ([str(filled["travel"]), "user"], "book a train to Lisbon") == ([row[0], row[2]], " ".join(row[-5:]))


def test_search_without_hits_says_so(capsys, writer_home, filled):
    rc, out, _ = cli(capsys, *home_args(writer_home), "session", "search", "zeppelin")
    assert (0, "no turns match 'zeppelin'\n") == (rc, out)


def test_snippet_centres_on_the_matching_word():
    text = "x " * 100 + "the tomatoes are ripe" + " y" * 100
    assert "…x the tomatoes are ripe y y y…" == session_cmd.snippet(text, "tomato", width=30)


def test_snippet_of_a_short_text_is_the_whole_text():
    assert "hello there, plan my week" == session_cmd.snippet("hello there, plan my week", "week")


def test_show_prints_the_header_and_turns_oldest_first(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "show", str(filled["garden"]), "--json")
    shown = json.loads(out)
    expected = ("garden", 3, ["user", "assistant", "user"],
                ["when should I water the tomatoes", "Water tomatoes early in the morning, twice a week.",
                 "and the basil?"])
    assert expected == (shown["session"]["chat"], shown["session"]["turns"], [t["role"] for t in shown["turns"]],
                        [t["content"] for t in shown["turns"]])


def test_show_limit_keeps_the_latest_turns(capsys, writer_home, filled):
    _, out, _ = cli(capsys, *home_args(writer_home), "session", "show", str(filled["garden"]), "--limit", "1")
    assert ("the last 1 of 3 turns", "    and the basil?") == (out.splitlines()[2], out.splitlines()[-1])


def test_show_of_an_unknown_session_exits_1(capsys, writer_home, filled):
    rc, _, err = cli(capsys, *home_args(writer_home), "session", "show", "999999")
    assert (1, True) == (rc, "no session 999999" in err)


def test_without_a_database_the_error_is_clear(capsys):
    home = make_home()
    try:
        rc, _, err = cli(capsys, "--home", str(home.root), "session", "list")
    finally:
        remove_home(home)
    assert (1, True) == (rc, "does not exist yet" in err)
