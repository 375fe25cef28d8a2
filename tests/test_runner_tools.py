"""Tool calls end to end, for both provider kinds against fakes as strict as the real APIs: approved, denied,
expired, waiting while the person writes on, parallel calls; one tool message per call reaches the model,
and `starling session show` shows each call once with its name, arguments and result."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from common.personas import create_pack
from common.stores import approval_store, turn_store
from services.runner.conversation import INTERRUPTED, UNANSWERED, WAITING
from tests.procs import REPO, wait_until
from tests.runner_stack import KINDS, collect, converse, reader, refused, start_stack, stop_stack, tool_calls, tool_results

QUICK = "quick"  # an agent whose approvals expire after a second


@pytest.fixture(scope="module", params=KINDS)
def stack(request):
    """A writer, a runner and a strict fake model of one kind; each test uses chats of its own."""
    home = start_stack(request.param)
    create_pack(home.paths, QUICK)
    settings = home.paths.agents_dir / QUICK / "config.toml"
    settings.write_text(settings.read_text().replace('mode = "ask"', 'mode = "ask"\nttl_s = 1.0'))
    yield home
    stop_stack(home)


class Since:
    """The model requests made from here on (what an earlier test left in the fake is dropped)."""

    def __init__(self, home) -> None:
        self.home = home
        home.fake.clear()

    def requests(self) -> list[dict]:
        return self.home.fake.requests(self.home.kind)

    def bodies(self) -> list[dict]:
        return [r["body"] for r in self.requests()]


def approval_id(notice: str) -> str:
    return re.search(r"/approve ([A-Z0-9]{8})", notice).group(1)


def one_result_per_call(body: dict) -> dict[str, str]:
    """Each call's result in a request; fails when a call has none or more than one."""
    results = tool_results(body)
    ids = [call_id for call_id, _ in results]
    assert sorted(ids) == sorted(c for c, _ in tool_calls(body)), (tool_calls(body), results)
    return dict(results)


def shell(command: str) -> dict:
    return {"name": "shell", "arguments": {"command": command}}


def session_show(home, session_id: int) -> str:
    result = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home.root), "session", "show",
                             str(session_id)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert 0 == result.returncode, result.stderr
    return result.stdout


def test_an_approved_call_sends_its_result_once_and_the_answer_arrives(stack):
    """The regression: the resumed turn sent the "waiting" stand-in and the result for one call (400)."""
    since = Since(stack)
    name = f"approved-{stack.kind}.txt"
    stack.fake.add({"tool_call": shell(f"touch {name} && echo made it")}, {"text": "Done: the file exists."})
    accepted, [notice] = converse(stack, "approve", f"please create {name}")
    _, replies = converse(stack, "approve", f"/approve {approval_id(notice)}", replies=2)
    final = since.bodies()[-1]
    [(call_id, _)] = tool_calls(final)
    assert ([], "Done: the file exists.") == (refused(since.requests()), replies[-1])
    assert {call_id: "[exit code 0]\nmade it"} == {k: v.rstrip() for k, v in one_result_per_call(final).items()}
    assert (stack.paths.workspace_dir / "private" / "default" / name).exists()
    shown = [line.strip() for line in session_show(stack, accepted.session_id).splitlines()]
    call_line = f'calls shell {{"command": "touch {name} && echo made it"}}'
    at = shown.index(call_line)
    assert (["[exit code 0]", "made it"], 1, 1) == (shown[at + 1:at + 3], shown.count(call_line), shown.count("made it"))
    assert (0, 0) == (sum(INTERRUPTED in line for line in shown), sum(WAITING in line for line in shown))


def test_a_denied_call_is_not_run_and_the_model_is_told_once(stack):
    since = Since(stack)
    stack.fake.add({"tool_call": shell("rm notes.txt")}, {"text": "Understood, I left it."})
    _, [notice] = converse(stack, "deny", "delete notes.txt")
    _, replies = converse(stack, "deny", f"/deny {approval_id(notice)}", replies=2)
    final = since.bodies()[-1]
    assert ([], "Understood, I left it.") == (refused(since.requests()), replies[-1])
    assert ["The person denied this action."] == list(one_result_per_call(final).values())


def test_an_expired_call_is_not_run_and_the_model_is_told_once(stack):
    since = Since(stack)
    name = f"expired-{stack.kind}.txt"
    stack.fake.add({"tool_call": shell(f"touch {name}")}, {"text": "Nobody answered, so I left it."})
    accepted, [notice] = converse(stack, "expire", f"create {name}", agent=QUICK)
    replies = collect(stack, "expire", timeout=15)  # the writer expires it within a second or two
    final = since.bodies()[-1]
    assert ([], ["Nobody answered, so I left it."]) == (refused(since.requests()), replies)
    assert ["Nobody decided in time; the action was not run."] == list(one_result_per_call(final).values())
    assert ("expired", False) == (approval_store.get(reader(stack), approval_id(notice)).state,
                                  (stack.paths.workspace_dir / "private" / QUICK / name).exists())


def test_a_call_waiting_for_approval_while_the_person_writes_on(stack):
    """Two calls in one answer, the first waits for approval; meanwhile the person writes twice."""
    since = Since(stack)
    name = f"waited-{stack.kind}.txt"
    stack.fake.add({"tool_calls": [shell(f"touch {name}"), {"name": "file_list", "arguments": {}}]},
                   {"text": "Still waiting for your approval."}, {"text": "Created it and listed the files."})
    accepted, [notice] = converse(stack, "wait", f"create {name} and list the files")
    _, [meanwhile] = converse(stack, "wait", "are you still there?")
    waiting_view = since.bodies()[-1]
    _, replies = converse(stack, "wait", f"/approve {approval_id(notice)}", replies=2)
    resumed = since.bodies()[-1]
    _, [later] = converse(stack, "wait", "thanks")
    after = since.bodies()[-1]
    assert ([], "Still waiting for your approval.", "Created it and listed the files.", "echo: thanks") == (
        refused(since.requests()), meanwhile, replies[-1], later)
    shell_id, list_id = (call_id for call_id, _ in tool_calls(waiting_view))
    assert {shell_id: WAITING, list_id: UNANSWERED} == one_result_per_call(waiting_view)
    for body in (resumed, after):  # the stand-ins are gone: each call has its own result, once
        results = one_result_per_call(body)
        assert (WAITING, UNANSWERED) != (results[shell_id], results[list_id])
        assert {WAITING, UNANSWERED, INTERRUPTED}.isdisjoint(results.values()), results
    assert "done" == turn_store.get(reader(stack), accepted.turn_id).state


def test_parallel_calls_get_one_result_each_in_one_answer(stack):
    since = Since(stack)
    stack.fake.add({"tool_calls": [
        {"name": "file_write", "arguments": {"path": f"par/{stack.kind}-a.txt", "content": "A"}},
        {"name": "file_write", "arguments": {"path": f"par/{stack.kind}-b.txt", "content": "B"}},
    ]}, {"text": "Both written."})
    _, replies = converse(stack, "parallel", "write a and b")
    final = since.bodies()[-1]
    shared = stack.paths.workspace_dir / "shared" / "par"
    assert ([], ["Both written."]) == (refused(since.requests()), replies)
    assert 2 == len(one_result_per_call(final))
    assert ("A", "B") == ((shared / f"{stack.kind}-a.txt").read_text(), (shared / f"{stack.kind}-b.txt").read_text())
    if stack.kind == "anthropic":  # both results in the one user message right after the calls
        assert ["tool_result", "tool_result"] == [b["type"] for b in final["messages"][-1]["content"]]


def test_session_show_lists_each_call_with_its_arguments_and_result_once(stack):
    since = Since(stack)
    stack.fake.add({"tool_call": {"name": "file_write", "arguments": {"path": f"shown-{stack.kind}.txt",
                                                                      "content": "hello"}}},
                   {"text": "Written."})
    accepted, _ = converse(stack, "show", "write hello")
    wait_until(lambda: len(since.requests()) >= 2, timeout=5, what="both model calls")
    shown = session_show(stack, accepted.session_id)
    call_line = f'calls file_write {{"path": "shown-{stack.kind}.txt", "content": "hello"}}'
    lines = shown.splitlines()
    at = next(i for i, line in enumerate(lines) if call_line in line)
    assert (1, 0, "Written.") == (shown.count(call_line), shown.count(INTERRUPTED), lines[-1].strip())
    assert lines[at + 1].strip().startswith("wrote 5 B to ")  # the result, right under its call
    assert not re.search(r"#\d+ tool\b", shown)  # no tool rows of their own: each result sits under its call
