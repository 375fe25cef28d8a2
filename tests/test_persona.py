"""Persona packs as the runner reads them, and conversations as the model sees them."""

from __future__ import annotations

import json
import os
import time

import pytest

from common.errors import ConfigError
from common.personas import create_pack
from common.stores import turn_store
from services.runner import conversation
from services.runner.llm import Message, ToolCall
from services.runner.persona import Personas


@pytest.fixture
def personas(home):
    create_pack(home.paths, "default")
    return Personas(home.paths.agents_dir), home.paths.agents_dir / "default"


def test_the_prompt_follows_the_documented_order(personas):
    cache, folder = personas
    for name in ("IDENTITY.md", "SOUL.md", "AGENTS.md", "USER.md", "MEMORY.md"):
        (folder / name).write_text(f"text of {name}")
    prompt = cache.get("default").system_prompt(summary="they met", channel="telegram")
    marks = [prompt.index(f"text of {n}") for n in ("IDENTITY.md", "SOUL.md", "AGENTS.md", "USER.md", "MEMORY.md")]
    assert (marks, True) == (sorted(marks), prompt.index("they met") > marks[-1])


def test_a_changed_file_is_read_again(personas):
    cache, folder = personas
    before = cache.get("default").system_prompt()
    (folder / "SOUL.md").write_text("Always answer in haiku.")
    stat = (folder / "SOUL.md").stat()
    os.utime(folder / "SOUL.md", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    after = cache.get("default").system_prompt()
    assert ("haiku" in before, "haiku" in after) == (False, True)


def test_skills_are_offered_by_name_and_description_and_loaded_on_demand(personas):
    cache, folder = personas
    (folder / "skills" / "weather").mkdir(parents=True)
    (folder / "skills" / "weather" / "SKILL.md").write_text("description: how to read a forecast\n\nStep 1: look up.")
    (folder / "skills.toml").write_text('skills = ["weather"]\n')
    persona = cache.get("default")
    prompt = persona.system_prompt()
    assert ("- weather: how to read a forecast" in prompt, "Step 1" in prompt) == (True, False)
    assert "Step 1: look up." in persona.skill_text("weather")


def test_a_bad_agent_config_names_the_file_and_key(personas):
    cache, folder = personas
    (folder / "config.toml").write_text('tools = "all"\n')
    with pytest.raises(ConfigError) as err:
        cache.get("default")
    assert (str(folder / "config.toml"), "tools") == (str(err.value.file), err.value.key)


def turn(id_, role, content="", meta="{}", state=None):
    return turn_store.Turn(id_, 1, role, content, "u", state, 0, "", meta, time.time())


def calls_meta(*ids):
    return json.dumps({"tool_calls": [{"id": i, "name": "shell", "arguments": {"command": "ls"}} for i in ids]})


def test_a_call_without_any_result_gets_one():
    messages, _ = conversation.to_messages([turn(1, "user", "hi"), turn(2, "assistant", "", calls_meta("a")),
                                            turn(3, "user", "again")])
    assert ["user", "assistant", "tool", "user"] == [m.role for m in messages]
    assert conversation.UNANSWERED == messages[2].content


def result_meta(call_id, mark=""):
    return json.dumps({"tool_call_id": call_id, "name": "shell", **({"mark": mark} if mark else {})})


def test_a_real_result_replaces_the_started_stand_in():
    messages, ids = conversation.to_messages([
        turn(1, "user", "hi"), turn(2, "assistant", "", calls_meta("a")),
        turn(3, "tool", conversation.INTERRUPTED, result_meta("a", "started")), turn(4, "tool", "real", result_meta("a"))])
    assert (["user", "assistant", "tool"], "real", [1, 2, 3]) == ([m.role for m in messages], messages[2].content, ids)


def test_a_started_call_is_interrupted_not_pending_and_a_waiting_call_is_pending():
    started, _ = conversation.to_messages([
        turn(1, "user", "hi"), turn(2, "assistant", "", calls_meta("a")),
        turn(3, "tool", conversation.INTERRUPTED, result_meta("a", "started"))])
    waiting, _ = conversation.to_messages([
        turn(1, "user", "hi"), turn(2, "assistant", "", calls_meta("a")),
        turn(3, "tool", conversation.INTERRUPTED, result_meta("a", "started")),
        turn(4, "tool", conversation.WAITING, result_meta("a", "waiting"))])
    assert ([], ["a"]) == ([c.id for c in conversation.pending_calls(started)],
                           [c.id for c in conversation.pending_calls(waiting)])
    assert (conversation.INTERRUPTED, conversation.WAITING) == (started[2].content, waiting[2].content)


def test_a_result_whose_call_fell_out_of_the_window_is_dropped():
    meta = json.dumps({"tool_call_id": "gone", "name": "shell"})
    messages, _ = conversation.to_messages([turn(5, "tool", "old output", meta), turn(6, "user", "next")])
    assert ["user"] == [m.role for m in messages]


def test_pending_calls_are_the_last_calls_without_results():
    messages = [Message("user", "x"), Message("assistant", "", tool_calls=(ToolCall("a", "shell", {}),
                                                                            ToolCall("b", "shell", {}))),
                Message("tool", "ok", tool_call_id="a", name="shell")]
    assert ["b"] == [c.id for c in conversation.pending_calls(messages)]


def test_the_compaction_cut_falls_on_a_user_message():
    messages = [Message("user", "a" * 400), Message("assistant", "", tool_calls=(ToolCall("c", "shell", {}),)),
                Message("tool", "r" * 400, tool_call_id="c"), Message("assistant", "b" * 400),
                Message("user", "q" * 40), Message("assistant", "short")]
    cut = conversation.compaction_cut(messages, keep_recent_tokens=20)
    assert ("user", 4) == (messages[cut].role, cut)
