"""`starling chat` at a terminal (a real pseudo-terminal, real writer, runner and fake model): answers, Ctrl-C while
waiting and at the prompt, a bracketed paste as one turn, a line continued with a backslash, an answer arriving
while idle, history 0600, Ctrl-D; and `chat -m` exiting 1 on a failed turn."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time

import pytest

from common import db
from common.stores import turn_store
from tests.procs import REPO
from tests.pty_term import CTRL_C, CTRL_D, ENTER, Terminal
from tests.runner_stack import start_stack, stop_stack


@pytest.fixture(scope="module")
def stack():
    home = start_stack("openai")
    yield home
    stop_stack(home)


@pytest.fixture
def term(stack, request):
    chat = request.node.name.removeprefix("test_")[:40]
    env = {**os.environ, "TERM": "xterm", "NO_COLOR": "1", "PROMPT_TOOLKIT_NO_CPR": "1"}
    t = Terminal([sys.executable, "-m", "common.cli", "--home", str(stack.root), "chat", "--chat", chat,
                  "--timeout", "30"], cwd=REPO, env=env)
    t.chat = chat
    t.expect("you>")
    yield t
    t.close()


def user_turns(stack, chat: str) -> list[str]:
    conn = db.open_reader(stack.paths.db_file)
    try:
        with db.read_tx(conn):
            return [t.content for t in turn_store.user_turns_for_chat(conn, "cli", chat)]
    finally:
        conn.close()


def test_an_answer_is_printed_and_ctrl_d_leaves(stack, term):
    term.type("hello there" + ENTER)
    at = term.expect(r"default> echo: hello there")
    term.expect("you>", after=at)
    term.send(CTRL_D)
    assert 0 == term.wait()


def test_ctrl_c_while_waiting_returns_to_the_prompt_and_the_answer_shows_while_idle(stack, term):
    stack.fake.add({"delay": 2.5, "text": "the slow answer"})
    term.type("take your time" + ENTER)
    time.sleep(0.5)  # the message is sent; the chat waits for the answer
    term.send(CTRL_C)
    at = term.expect(r"stopped waiting", timeout=5)
    at = term.expect("you>", after=at, timeout=5)
    assert None is term.proc.poll()  # Ctrl-C did not end the chat
    term.expect(r"default> the slow answer", after=at, timeout=15)  # no key pressed since
    term.type("and now" + ENTER)
    term.expect(r"default> echo: and now", after=at)


def test_an_approval_request_and_the_answer_to_it_decided_elsewhere_show_while_idle(stack, term):
    stack.fake.add({"tool_call": {"name": "shell", "arguments": {"command": "touch decided-elsewhere.txt"}}},
                   {"text": "Done after the approval."})
    term.type("please make the file" + ENTER)
    at = term.expect(r"/approve [A-Z0-9]{8}")
    approval_id = re.findall(r"/approve ([A-Z0-9]{8})", term.text())[-1]
    at = term.expect("you>", after=at)
    decided = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(stack.root), "approvals", "approve",
                              approval_id], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert 0 == decided.returncode, decided.stderr
    term.expect(r"default> Done after the approval\.", after=at, timeout=20)


def test_approve_typed_in_the_chat_resumes_the_turn_and_shows_its_answer(stack, term):
    stack.fake.add({"tool_call": {"name": "shell", "arguments": {"command": "touch approved-in-chat.txt"}}},
                   {"text": "Done from the chat."})
    term.type("please make another file" + ENTER)
    at = term.expect(r"/approve [A-Z0-9]{8}")
    approval_id = re.findall(r"/approve ([A-Z0-9]{8})", term.text())[-1]
    at = term.expect("you>", after=at)
    term.type(f"/approve {approval_id}" + ENTER)
    term.expect(rf"default> Approved {approval_id}\.", after=at)
    term.expect(r"default> Done from the chat\.", after=at)


def test_ctrl_c_at_the_prompt_clears_the_line_without_waiting_for_enter(stack, term):
    term.type("a draft I regret")
    time.sleep(0.2)
    term.send(CTRL_C)
    time.sleep(0.3)
    term.type("the real one" + ENTER)
    term.expect(r"default> echo: the real one")
    assert (["the real one"], None) == (user_turns(stack, term.chat), term.proc.poll())


def test_a_bracketed_paste_of_three_lines_is_one_turn(stack, term):
    term.paste("first line\nsecond line\nthird line")
    time.sleep(0.3)
    term.send(ENTER)
    term.expect(r"default> echo: first line\s+second line\s+third line")
    assert ["first line\nsecond line\nthird line"] == user_turns(stack, term.chat)


def test_a_trailing_backslash_continues_the_message_on_a_new_line(stack, term):
    term.type("one\\" + ENTER)
    term.type("two" + ENTER)
    term.expect(r"default> echo: one\s+two")
    assert ["one\ntwo"] == user_turns(stack, term.chat)


def test_the_history_file_is_private(stack, term):
    term.type("remember me" + ENTER)
    term.expect(r"default> echo: remember me")
    history = stack.paths.data_dir / "chat-history"
    assert (0o600, True) == (stat.S_IMODE(history.stat().st_mode), "remember me" in history.read_text())


def test_chat_m_exits_1_when_the_turn_fails(stack):
    stack.fake.add({"status": 401, "message": "Incorrect API key provided", "api": "openai"})
    result = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(stack.root), "chat", "--chat",
                             "failing", "-m", "hello?", "--timeout", "20"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert (1, True) == (result.returncode, "rejected the API key" in result.stdout), result


def test_chat_m_exits_0_when_the_turn_is_answered(stack):
    result = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(stack.root), "chat", "--chat",
                             "fine", "-m", "hello!", "--timeout", "20"], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert (0, True) == (result.returncode, "echo: hello!" in result.stdout), result


def test_a_long_history_is_trimmed_to_its_newest_entries_whole(tmp_path):
    from prompt_toolkit.history import FileHistory

    from common.cli.chat_cmd import trim_history
    path = tmp_path / "chat-history"
    history = FileHistory(str(path))
    for i in range(3000):
        history.store_string(f"message {i}\nits second line")
    trim_history(path, max_bytes=20000)
    kept = list(FileHistory(str(path)).load_history_strings())  # newest first
    assert (True, "message 2999\nits second line", True, 0o600) == (
        path.stat().st_size <= 10000, kept[0], all(k.endswith("\nits second line") for k in kept),
        stat.S_IMODE(path.stat().st_mode))
