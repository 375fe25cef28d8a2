"""The runner end to end: real writer and runner processes, a strict fake model server (OpenAI, and Anthropic
where the path differs by provider kind)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time
import uuid

import pytest

from common.stores import approval_store, audit_store, outbox_store, session_store, turn_store
from schema import messages as m
from services.runner.conversation import INTERRUPTED
from tests.procs import REPO, Proc, start_writer, wait_until
from tests.runner_stack import (
    GATEWAY, KINDS, converse, own_home, reader, refused, start_stack, started, stop_stack, texts, tool_calls,
    tool_results,
)


@pytest.fixture(scope="module")
def stack():
    """A home with a writer, one runner and a fake OpenAI model; tests use their own chats."""
    home = start_stack("openai")
    yield home
    stop_stack(home)


def test_a_message_gets_the_models_answer(stack):
    accepted, replies = converse(stack, "hello-chat", "hello there")
    assert ["echo: hello there"] == replies
    conn = reader(stack)
    assert "done" == turn_store.get(conn, accepted.turn_id).state


def test_the_system_prompt_is_the_persona_in_its_documented_order(stack):
    converse(stack, "prompt-chat", "who are you")
    request = stack.fake.requests("openai")[-1]["body"]
    system = request["messages"][0]["content"]
    order = [system.index(f"<!-- {name} -->") for name in ("IDENTITY.md", "SOUL.md", "AGENTS.md", "USER.md", "MEMORY.md")]
    assert ("system", order, "who are you") == (request["messages"][0]["role"], sorted(order),
                                                 request["messages"][-1]["content"])


def test_the_tool_loop_writes_a_file_and_the_model_sees_the_result(stack):
    stack.fake.add({"tool_call": {"name": "file_write", "arguments": {"path": "notes/plan.txt", "content": "step 1"}}},
                   {"text": "I wrote your plan."})
    accepted, replies = converse(stack, "tool-chat", "write my plan down")
    written = (stack.paths.workspace_dir / "shared" / "notes" / "plan.txt").read_text()
    second = stack.fake.requests("openai")[-1]["body"]["messages"]
    tool_message = next(msg for msg in second if msg["role"] == "tool")
    conn = reader(stack)
    audit = audit_store.tools_for_session(conn, accepted.session_id)
    assert (["I wrote your plan."], "step 1") == (replies, written)
    assert ("file_write", "ok") == (audit[0].tool, audit[0].outcome)
    assert tool_message["tool_call_id"] == second[-2]["tool_calls"][0]["id"]


def test_an_approval_round_trip_resumes_the_turn_and_runs_the_command(stack):
    stack.fake.add({"tool_call": {"name": "shell", "arguments": {"command": "touch approved.txt"}}},
                   {"text": "Done: the file exists."})
    accepted, notice = converse(stack, "approve-chat", "please create approved.txt")
    approval_id = re.search(r"/approve ([A-Z0-9]{8})", notice[0]).group(1)
    conn = reader(stack)
    parked = turn_store.get(conn, accepted.turn_id).state
    _, replies = converse(stack, "approve-chat", f"/approve {approval_id}", replies=2)
    created = (stack.paths.workspace_dir / "private" / "default" / "approved.txt").exists()
    assert ("waiting", True) == (parked, created)
    assert [f"Approved {approval_id}.", "Done: the file exists."] == sorted(replies, key=lambda r: not r.startswith("Approved"))
    conn = reader(stack)
    assert ("approved", "done") == (approval_store.get(conn, approval_id).state, turn_store.get(conn, accepted.turn_id).state)


def test_a_denied_call_is_not_run_and_the_model_is_told(stack):
    stack.fake.add({"tool_call": {"name": "shell", "arguments": {"command": "rm notes.txt"}}},
                   {"text": "Understood, I left it."})
    _, notice = converse(stack, "deny-chat", "delete notes.txt")
    approval_id = re.search(r"/deny ([A-Z0-9]{8})", notice[0]).group(1)
    _, replies = converse(stack, "deny-chat", f"/deny {approval_id}", replies=2)
    told = [msg for msg in stack.fake.requests("openai")[-1]["body"]["messages"] if msg["role"] == "tool"]
    assert ("Understood, I left it." in replies, "The person denied this action.") == (True, told[-1]["content"])


def test_new_starts_a_fresh_conversation(stack):
    first, _ = converse(stack, "new-chat", "remember the blue door")
    converse(stack, "new-chat", "/new")
    second, replies = converse(stack, "new-chat", "what door?")
    messages = stack.fake.requests("openai")[-1]["body"]["messages"]
    assert (True, ["user"]) == (first.session_id != second.session_id, [msg["role"] for msg in messages[1:]])


def test_status_and_help_answer_without_the_model(stack):
    before = len(stack.fake.requests("openai"))
    _, status = converse(stack, "status-chat", "/status")
    _, help_text = converse(stack, "status-chat", "/help")
    assert (before, True, True) == (len(stack.fake.requests("openai")), "fake-model" in status[0], "/new" in help_text[0])


def test_a_malformed_model_answer_is_a_clear_error_turn_and_the_runner_lives(stack):
    stack.fake.add({"malformed": "not_json"})
    accepted, replies = converse(stack, "bad-chat", "hi")
    conn = reader(stack)
    assert (True, "failed", True) == ("could not read" in replies[0], turn_store.get(conn, accepted.turn_id).state,
                                      stack.runner.alive())


def test_one_sessions_turns_are_answered_in_order(stack):
    """Queued at once, the five are answered in order; under queue = "collect" (the default) the ones that
    waited are answered together, each answer naming the newest it covers (the echo model)."""

    async def go():
        async with stack.client("gateway") as c:
            for i in range(5):
                await c.call(m.Inbound(agent="default", instance=GATEWAY, chat="order-chat", sender="u1",
                                       text=f"number {i}", dedupe_keys=[uuid.uuid4().hex]))
            got: list[str] = []
            deadline = time.monotonic() + 20
            while not got[-1:] == ["echo: number 4"] and time.monotonic() < deadline:
                claim = await c.call(m.ClaimOutbox(worker="gw", instances=[GATEWAY], chats=["order-chat"]))
                for item in claim.items:
                    got.append(item.body)
                    await c.call(m.OutboxSent(id=item.id, worker="gw"))
                await asyncio.sleep(0.02)
            return got

    got = asyncio.run(go())
    numbers = [int(text.removeprefix("echo: number ")) for text in got]
    assert (numbers == sorted(set(numbers)), 4) == (True, numbers[-1]), got


def test_a_missing_key_is_answered_with_how_to_set_it():
    with own_home(lambda text: text.replace("127.0.0.1", "example.invalid"), key=False) as home:
        started(home, start_writer(home))
        started(home, Proc(home, "runner"))
        _, replies = converse(home, "nokey", "hello")
        assert "starling secret set openai --value-stdin" in replies[0]


def test_kill9_of_a_runner_mid_turn_gives_exactly_one_answer():
    with own_home() as home:
        home.fake.add({"delay": 3.0, "text": "slow answer that never arrives"}, {"text": "the answer"})
        started(home, start_writer(home))
        first = started(home, Proc(home, "runner"))

        async def send():
            async with home.client("gateway") as c:
                return await c.call(m.Inbound(agent="default", instance=GATEWAY, chat="crash", sender="u1",
                                              text="hello", dedupe_keys=["crash:1"]))

        accepted = asyncio.run(send())
        wait_until(lambda: len(home.fake.requests("openai")) >= 1, timeout=15, what="the model to be asked")
        first.kill9()
        started(home, Proc(home, "runner"))
        wait_until(lambda: turn_store.get(reader(home), accepted.turn_id).state == "done", timeout=30,
                   what="the turn to be answered by the second runner")
        time.sleep(1.0)
        rows = outbox_store.for_chat(reader(home), GATEWAY, "crash")
        # the second runner (the same name) took the turn back at once: the killed attempt is given back
        assert (["the answer"], 1) == ([r.body for r in rows], turn_store.get(reader(home), accepted.turn_id).attempts)


def test_starling_chat_talks_to_the_agent_through_the_bus(stack):
    result = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(stack.root), "chat", "--chat", "term",
                             "-m", "hi from the terminal", "--timeout", "20"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    rows = outbox_store.for_chat(reader(stack), "cli", "term")
    assert (0, True, ["sent"]) == (result.returncode, "echo: hi from the terminal" in result.stdout,
                                   [r.state for r in rows]), result.stderr


@pytest.mark.parametrize("kind", KINDS)
def test_compaction_summarises_older_turns_and_keeps_recent_ones_and_call_result_pairs(kind):
    # a tiny window: a few turns already pass max_context_ratio of it
    with own_home(lambda text: text.replace("context_window = 100000", "context_window = 400"), kind=kind) as home:
        for name in ("IDENTITY.md", "SOUL.md", "AGENTS.md", "USER.md", "MEMORY.md"):
            (home.paths.agents_dir / "default" / name).write_text("")  # keep the prompt small
        started(home, start_writer(home))
        started(home, Proc(home, "runner"))
        home.fake.add({"tool_call": {"name": "file_list", "arguments": {}}}, {"text": "listed " + "x" * 300})
        converse(home, "long", "first question about the garden " + "y" * 300)
        converse(home, "long", "second question " + "z" * 300)
        home.fake.add({"text": "SUMMARY: garden talk"}, {"text": "third answer"})
        accepted, replies = converse(home, "long", "third question")
        requests = home.fake.requests(kind)
        summary_request, final_request = requests[-2]["body"], requests[-1]["body"]
        summary, upto = session_store.summary(reader(home), accepted.session_id)
    history = [msg for msg in final_request["messages"] if msg["role"] != "system"]
    assert (["third answer"], "SUMMARY: garden talk", []) == (replies, summary, refused(requests))
    # the compacted part held the tool call and its result
    assert "first question about the garden" in texts(summary_request)[-1]
    assert "[tool file_list result]" in texts(summary_request)[-1]
    assert "SUMMARY: garden talk" in texts(final_request)[0]
    assert "third question" == texts(final_request)[-1]
    assert "first question" not in json.dumps(history)
    assert {call_id for call_id, _ in tool_results(final_request)} <= {c for c, _ in tool_calls(final_request)}
    assert upto > 0


def test_two_runners_answer_many_chats_once_each_and_in_order_per_chat():
    chats, per_chat = 6, 5
    # one turn at a time per runner: neither can take every chat's head alone
    with own_home(lambda text: text.replace("lease_s = 3\n", "lease_s = 3\nturns_per_process = 1\n")
                  + '[conversation]\nqueue = "followup"\n') as home:  # one answer per message
        started(home, start_writer(home))
        runners = [started(home, Proc(home, "runner", "--name", f"runner-{i}")) for i in range(2)]
        for r in runners:
            wait_until(lambda: '"event":"ready"' in r.log_text(), timeout=20, what=f"{r.service} ready")

        async def go():
            async with home.client("gateway") as c:
                for n in range(per_chat):
                    for chat in range(chats):
                        await c.call(m.Inbound(agent="default", instance=GATEWAY, chat=f"c{chat}", sender="u1",
                                               text=f"c{chat} m{n}", dedupe_keys=[f"{chat}:{n}"]))
                got: dict[str, list[str]] = {f"c{chat}": [] for chat in range(chats)}
                deadline = time.monotonic() + 30
                while sum(map(len, got.values())) < chats * per_chat and time.monotonic() < deadline:
                    claim = await c.call(m.ClaimOutbox(worker="gw", instances=[GATEWAY], limit=50))
                    for item in claim.items:
                        got[item.chat].append(item.body)
                        await c.call(m.OutboxSent(id=item.id, worker="gw"))
                    await asyncio.sleep(0.02)
                return got

        got = asyncio.run(go())
        workers = {json.loads(line)["service"] for r in runners for line in r.log_text().splitlines()
                   if '"turn_claimed"' in line}
    expected = {f"c{chat}": [f"echo: c{chat} m{n}" for n in range(per_chat)] for chat in range(chats)}
    assert (expected, {"runner-0", "runner-1"}) == (got, workers)


def test_an_anthropic_provider_answers_too():
    with own_home(kind="anthropic") as home:
        home.fake.add({"api": "anthropic", "tool_call": {"name": "file_list", "arguments": {}}},
                      {"api": "anthropic", "text": "Your workspace is empty."})
        started(home, start_writer(home))
        started(home, Proc(home, "runner"))
        _, replies = converse(home, "claude", "what is in my workspace?")
        second = home.fake.requests("anthropic")[-1]["body"]["messages"]
    assert (["Your workspace is empty."], "tool_result") == (replies, second[-1]["content"][0]["type"])


@pytest.mark.parametrize(("kind", "how"), [("openai", "stop"), ("openai", "kill9"), ("anthropic", "kill9")])
def test_a_tool_call_running_when_its_runner_stops_is_not_run_again(kind, how):
    with own_home(kind=kind) as home:
        settings = home.paths.agents_dir / "default" / "config.toml"
        settings.write_text(settings.read_text().replace('mode = "ask"', 'mode = "auto"'))
        home.fake.add({"tool_call": {"name": "shell", "arguments": {"command": "echo ran >> count.txt; sleep 4"}}},
                      {"text": "finished"})
        count = home.paths.workspace_dir / "private" / "default" / "count.txt"
        started(home, start_writer(home))
        first = started(home, Proc(home, "runner", "--name", "runner-a"))

        async def send():
            async with home.client("gateway") as c:
                return await c.call(m.Inbound(agent="default", instance=GATEWAY, chat="rerun", sender="u1",
                                              text="count", dedupe_keys=["rerun:1"]))

        accepted = asyncio.run(send())
        wait_until(count.exists, timeout=15, what="the command to start")
        if how == "stop":
            first.stop()  # SIGTERM: the claim is handed back mid-command
        else:
            first.kill9()  # the lease runs out (lease_s = 3) and the next runner takes the turn
        started(home, Proc(home, "runner", "--name", "runner-b"))
        wait_until(lambda: turn_store.get(reader(home), accepted.turn_id).state == "done", timeout=30,
                   what="the second runner to finish the turn")
        requests = home.fake.requests(kind)
        # the write-ahead "started" record stands for the result: one tool message, saying so
        told = [content for _, content in tool_results(requests[-1]["body"])]
        rows = outbox_store.for_chat(reader(home), GATEWAY, "rerun")
        ran = count.read_text().split()
    assert (["ran"], [INTERRUPTED], [], ["finished"]) == (ran, told, refused(requests), [r.body for r in rows])


def test_chat_shows_the_answer_of_the_turn_an_approve_resumes(stack):
    stack.fake.add({"tool_call": {"name": "shell", "arguments": {"command": "touch from-chat.txt"}}},
                   {"text": "Created from the terminal."})

    def chat(text: str) -> str:
        result = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(stack.root), "chat", "--chat",
                                 "term-approve", "-m", text, "--timeout", "20"], cwd=REPO, capture_output=True,
                                text=True, timeout=60)
        assert 0 == result.returncode, result.stderr
        return result.stdout

    notice = chat("create from-chat.txt")
    approval_id = re.search(r"/approve ([A-Z0-9]{8})", notice).group(1)
    answer = chat(f"/approve {approval_id}")
    assert (True, True) == (f"Approved {approval_id}." in answer, "Created from the terminal." in answer)
