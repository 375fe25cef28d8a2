"""Bursts: [conversation] queue = collect | followup | interrupt, end to end through a real writer and runner
and strict fake models of both kinds. Each message is stored and acknowledged once as its own user turn;
collect answers the messages that waited together (one answer per folded turn), followup one each,
interrupt restarts the model call (never a tool) with the newcomer; order is kept in every chat."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from common.stores import session_store, turn_store
from schema import messages as m
from tests.procs import Proc, start_writer
from tests.runner_stack import GATEWAY, KINDS, _collect, converse, own_home, reader, refused, started, texts


def start(home, auto: bool = False):
    """The writer and a runner, the runner answering already (a burst must not wait for it to start)."""
    if auto:  # approval mode auto: a shell command runs without asking
        settings = home.paths.agents_dir / "default" / "config.toml"
        settings.write_text(settings.read_text().replace('mode = "ask"', 'mode = "auto"'))
    started(home, start_writer(home))
    started(home, Proc(home, "runner"))
    assert ["echo: warm"] == converse(home, "warm-up", "warm")[1]
    home.fake.clear()  # its request and script


async def send(c, chat: str, text: str) -> m.Accepted:
    return await c.call(m.Inbound(agent="default", instance=GATEWAY, chat=chat, sender="u1", text=text,
                                  dedupe_keys=[f"{chat}:{text}"]))


def burst(home, plan: dict[str, list[tuple[float, str]]], replies: dict[str, int], timeout: float = 15.0):
    """Send each chat's (delay after the previous, text) messages, chats side by side; then collect each
    chat's replies. Returns (accepted by text, replies by chat, the same messages sent again)."""

    async def go():
        async with home.client("gateway") as c:
            accepted: dict[str, m.Accepted] = {}

            async def chat_messages(chat, steps):
                for pause, text in steps:
                    await asyncio.sleep(pause)
                    accepted[text] = await send(c, chat, text)

            await asyncio.gather(*(chat_messages(chat, steps) for chat, steps in plan.items()))
            got = {chat: await _collect(c, chat, replies[chat], timeout) for chat in plan}
            again = {text: await send(c, chat, text) for chat, steps in plan.items() for _, text in steps}
            await asyncio.sleep(0.5)  # a second reply would be queued by now
            extra = {chat: await _collect(c, chat, 1, 0.3) for chat in plan}
            return accepted, got, again, extra

    return asyncio.run(go())


def joined(kind: str, texts: list[str]) -> str:
    """The last user text the echo model answers: Anthropic merges consecutive user messages into one."""
    return " ".join(texts) if kind == "anthropic" else texts[-1]


def user_texts(body: dict) -> list[str]:
    """The texts of a request's user messages (OpenAI's string content, Anthropic's text blocks)."""
    out = []
    for msg in body["messages"]:
        if msg["role"] != "user":
            continue
        content = msg["content"]
        out += [content] if isinstance(content, str) else [b["text"] for b in content if b.get("type") == "text"]
    return out


def stored_once(home, accepted: dict[str, m.Accepted], again: dict[str, m.Accepted]) -> dict[int, turn_store.Turn]:
    """Every message is its own user turn, acknowledged once: sending it again finds the same turn."""
    assert {t: a.turn_id for t, a in accepted.items()} == {t: a.turn_id for t, a in again.items()}
    assert len({a.turn_id for a in accepted.values()}) == len(accepted)
    conn = reader(home)
    turns = {a.turn_id: turn_store.get(conn, a.turn_id) for a in accepted.values()}
    assert all(t is not None and t.role == "user" and t.state == "done" for t in turns.values()), turns
    return turns


@pytest.mark.parametrize("kind", KINDS)
def test_collect_answers_a_burst_together_in_order_across_chats(kind):
    with own_home(lambda t: t, kind=kind) as home:  # collect is the default
        start(home)
        home.fake.add({"when": "a0", "delay": 1.0}, {"when": "b0", "delay": 1.0})
        plan = {chat: [(0.0, f"{chat}0")] + [(0.15, f"{chat}{n}") for n in range(1, 5)] for chat in ("a", "b")}
        accepted, got, again, extra = burst(home, plan, {"a": 2, "b": 2})
        # the first message alone (its slow call), then the four that came meanwhile: one answer
        last = {chat: joined(kind, [f"{chat}{n}" for n in range(1, 5)]) for chat in ("a", "b")}
        assert {"a": ["echo: a0", f"echo: {last['a']}"], "b": ["echo: b0", f"echo: {last['b']}"]} == got
        assert {"a": [], "b": []} == extra
        requests = home.fake.requests(kind)
        assert [] == refused(requests)
        assert 4 == len(requests)  # one model call per folded turn
        for chat in ("a", "b"):
            bodies = [r["body"] for r in requests if f"{chat}0" in user_texts(r["body"])]
            assert [f"{chat}0", f"{chat}1", f"{chat}2", f"{chat}3", f"{chat}4"] == user_texts(bodies[-1])
        turns = stored_once(home, accepted, again)
        for chat in ("a", "b"):
            head = accepted[f"{chat}1"].turn_id
            for n in range(2, 5):
                assert head == json.loads(turns[accepted[f"{chat}{n}"].turn_id].meta)["folded_into"]
            assert "folded_into" not in json.loads(turns[head].meta)


@pytest.mark.parametrize("kind", KINDS)
def test_collect_folds_a_message_that_came_during_a_tool_before_the_next_model_call(kind):
    with own_home(lambda t: t, kind=kind) as home:
        start(home)
        home.fake.add({"when": "list", "delay": 0.8, "tool_call": {"name": "file_list", "arguments": {}}},
                      {"text": "Listed, and noted your second message."})
        plan = {"t": [(0.0, "list the files"), (0.4, "and then say hi")]}
        accepted, got, again, extra = burst(home, plan, {"t": 1})
        assert {"t": ["Listed, and noted your second message."]} == got and {"t": []} == extra
        requests = home.fake.requests(kind)
        assert [] == refused(requests) and 2 == len(requests)
        last = requests[-1]["body"]
        assert ["list the files", "and then say hi"] == user_texts(last)
        assert "and then say hi" == texts(last)[-1]  # after the tool's result, as it came
        stored_once(home, accepted, again)


def test_followup_answers_each_message_in_its_own_turn():
    with own_home(lambda t: t + '[conversation]\nqueue = "followup"\n') as home:
        start(home)
        home.fake.add({"when": "f0", "delay": 0.8})
        plan = {"f": [(0.0, "f0"), (0.1, "f1"), (0.1, "f2"), (0.1, "f3")], "g": [(0.05, "g0"), (0.1, "g1")]}
        accepted, got, again, extra = burst(home, plan, {"f": 4, "g": 2})
        assert {"f": ["echo: f0", "echo: f1", "echo: f2", "echo: f3"], "g": ["echo: g0", "echo: g1"]} == got
        assert {"f": [], "g": []} == extra
        requests = home.fake.requests("openai")
        assert [] == refused(requests) and 6 == len(requests)
        turns = stored_once(home, accepted, again)
        assert all("folded_into" not in json.loads(t.meta) for t in turns.values())


@pytest.mark.parametrize("kind", KINDS)
def test_interrupt_restarts_the_model_call_with_the_newcomer(kind):
    with own_home(lambda t: t + '[conversation]\nqueue = "interrupt"\n', kind=kind) as home:
        start(home)
        home.fake.add({"when": "i0", "delay": 5.0})
        began = time.monotonic()
        plan = {"i": [(0.0, "i0"), (0.6, "i1")]}
        accepted, got, again, extra = burst(home, plan, {"i": 1})
        assert {"i": [f"echo: {joined(kind, ['i0', 'i1'])}"]} == got and {"i": []} == extra
        assert time.monotonic() - began < 4.5  # the 5 s call was cut short, not waited for
        requests = home.fake.requests(kind)
        assert [] == refused(requests) and 2 == len(requests)
        assert (["i0"], ["i0", "i1"]) == (user_texts(requests[0]["body"]), user_texts(requests[1]["body"]))
        turns = stored_once(home, accepted, again)
        assert accepted["i0"].turn_id == json.loads(turns[accepted["i1"].turn_id].meta)["folded_into"]


def test_interrupt_never_cancels_a_running_tool():
    with own_home(lambda t: t + '[conversation]\nqueue = "interrupt"\n') as home:
        mark = f"ran-{uuid.uuid4().hex[:6]}"
        start(home, auto=True)
        home.fake.add({"when": "go", "tool_call": {"name": "shell", "arguments": {
            "command": f"sleep 1.2 && echo {mark}"}}}, {"text": "Done, and read your note."})
        plan = {"s": [(0.0, "go"), (0.5, "a note while it runs")]}
        accepted, got, again, extra = burst(home, plan, {"s": 1})
        assert {"s": ["Done, and read your note."]} == got and {"s": []} == extra
        requests = home.fake.requests("openai")
        assert [] == refused(requests) and 2 == len(requests)
        last = requests[-1]["body"]
        assert any(mark in text for text in texts(last) + [
            msg["content"] for msg in last["messages"] if msg["role"] == "tool"])  # the tool ran to its end
        assert ["go", "a note while it runs"] == user_texts(last)
        stored_once(home, accepted, again)


@pytest.mark.parametrize("kind", KINDS)
def test_compaction_never_cuts_between_a_turn_and_a_message_folded_into_it(kind):
    # a small window: the folded message's size makes the turn compact, and a cut right before that message
    # (the newest user message leaving enough recent text) would summarise its turn and keep it verbatim
    with own_home(lambda t: t.replace("context_window = 100000", "context_window = 600"), kind=kind) as home:
        for name in ("IDENTITY.md", "SOUL.md", "AGENTS.md", "USER.md", "MEMORY.md"):
            (home.paths.agents_dir / "default" / name).write_text("")  # keep the prompt small
        start(home)
        converse(home, "small", "hello " + "y" * 600)
        home.fake.clear()
        home.fake.add({"when": "t0", "delay": 1.0}, {"text": "SUMMARY: a greeting"})  # the next request sums up
        big = "f2 " + "z" * 900
        plan = {"small": [(0.0, "t0"), (0.3, "f1"), (0.1, big)]}
        accepted, got, again, extra = burst(home, plan, {"small": 2})
        requests = home.fake.requests(kind)
        summary, upto = session_store.summary(reader(home), accepted["t0"].session_id)
        assert [] == refused(requests)
        assert "SUMMARY: a greeting" == summary
        assert accepted["t0"].turn_id < upto + 1 == accepted["f1"].turn_id  # cut before the turn f2 joined
        final = requests[-1]["body"]
        assert ["f1", big] == user_texts(final)[-2:]
        stored_once(home, accepted, again)


def test_collect_waits_for_the_previous_reply_to_go_out_and_folds_what_came_meanwhile():
    """A chat's reply still waiting for its platform's pace (here: nobody takes it yet): the session's next turn
    waits for it (at most DELIVERY_WAIT_S), and a message that comes meanwhile joins that turn."""
    with own_home(lambda t: t) as home:
        start(home)
        plan = {"p": [(0.0, "p0"), (0.2, "p1"), (0.3, "p2")]}  # p0's reply is not taken before all three are in
        accepted, got, again, extra = burst(home, plan, {"p": 2})
        assert {"p": ["echo: p0", "echo: p2"]} == got and {"p": []} == extra
        requests = home.fake.requests("openai")
        assert [] == refused(requests) and 2 == len(requests)
        assert ["p0", "p1", "p2"] == user_texts(requests[-1]["body"])
        stored_once(home, accepted, again)
