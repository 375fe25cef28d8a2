"""The registry (specs, argument checks, errors, redaction, output bound) and the memory, recall, send,
cron and job tools. Cron, jobs and recall run against a real writer; the rest against a fake call."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from common import db
from common.log import register_secret
from schema import messages as m
from services.runner.llm import ToolSpec
from services.runner.tools import memory, output, registry
from services.runner.tools.base import Tool, ToolContext, ToolResult
from tests.tool_helpers import FakeWriter, make_ctx, no_secrets_from_other_tests  # noqa: F401 - a fixture


@pytest.fixture
def writer(home) -> FakeWriter:
    return FakeWriter()


@pytest.fixture
def ctx(home, writer) -> ToolContext:
    return make_ctx(home, call=writer.call)


def run(ctx: ToolContext, tool: str, /, **args) -> ToolResult:
    return asyncio.run(registry.execute(ctx, tool, args))


# ---------------------------------------------------------------- registry


def test_every_group_has_tools_and_every_tool_a_group():
    assert set(registry.GROUPS) == {tool.group for tool in registry.TOOLS.values()}


def test_specs_for_returns_only_enabled_groups():
    names = [spec.name for spec in registry.specs_for(["memory", "recall"])]
    assert ["memory_read", "memory_edit", "people_note", "recall_search"] == names
    assert [] == registry.specs_for([])


def test_every_spec_is_an_object_schema_with_a_description():
    for spec in registry.specs_for(registry.GROUPS):
        assert spec.description
        assert "object" == spec.parameters["type"]
        assert set(spec.parameters.get("required", [])) <= set(spec.parameters["properties"])


def test_unknown_tool_is_an_error_result(ctx):
    result = run(ctx, "launch_rockets")
    assert "error" == result.outcome
    assert "unknown tool 'launch_rockets'" in result.content


def test_a_tool_of_a_disabled_group_is_unknown(ctx):
    result = asyncio.run(registry.execute(ctx, "shell", {"command": "ls"}, enabled_groups=["files"]))
    assert "error" == result.outcome
    assert "file_read" in result.content and "shell," not in result.content


@pytest.mark.parametrize("args,fragment", [
    ({}, "missing required argument 'path'"),
    ({"path": 3}, "'path' must be a string"),
    ({"path": "a", "offset": "many"}, "'offset' must be an integer"),
    ({"path": "a", "offset": 0}, "'offset' must be at least 1"),
    ({"path": "a", "colour": "red"}, "unknown argument 'colour'"),
    ({"_raw": "{not json"}, "not valid JSON"),
])
def test_bad_arguments_are_error_results(ctx, args, fragment):
    result = asyncio.run(registry.execute(ctx, "file_read", args))
    assert "error" == result.outcome
    assert fragment in result.content
    assert "file_read takes: path (string, required)" in result.content


def test_arguments_sent_as_strings_are_coerced(ctx):
    (ctx.paths.shared_workspace / "f.txt").write_text("a\nb\nc\n")
    result = asyncio.run(registry.execute(ctx, "file_read", {"path": "f.txt", "offset": "2", "limit": 1.0}))
    assert "ok" == result.outcome
    assert ["b"] == result.content.splitlines()[1:2]


def test_null_optional_arguments_count_as_absent(ctx):
    (ctx.paths.shared_workspace / "f.txt").write_text("a\n")
    assert "ok" == asyncio.run(registry.execute(ctx, "file_read", {"path": "f.txt", "offset": None})).outcome


def _install(monkeypatch, name: str, run_fn, limit: int = output.INLINE_LIMIT) -> None:
    tool = Tool(ToolSpec(name, "test tool", {"type": "object", "properties": {}}), "files", run_fn, limit)
    monkeypatch.setitem(registry.TOOLS, name, tool)


def test_an_exception_inside_a_tool_is_an_error_with_a_redacted_message(ctx, monkeypatch):
    register_secret("hunter2-secret-value")

    async def boom(ctx, args):
        raise RuntimeError("could not log in with hunter2-secret-value")

    _install(monkeypatch, "boom", boom)
    result = run(ctx, "boom")
    assert "error" == result.outcome
    assert "boom failed: RuntimeError: could not log in with [redacted]" == result.content


def test_a_large_result_goes_to_tool_output_with_a_head(ctx, monkeypatch):
    body = "".join(f"row {i}\n" for i in range(10000))

    async def big(ctx, args):
        return ToolResult(body)

    _install(monkeypatch, "big", big)
    first, second = run(ctx, "big"), run(ctx, "big")
    path = Path(first.result_path)
    assert ctx.paths.tool_output_dir / "5" / "11-1-big.txt" == path
    assert ctx.paths.tool_output_dir / "5" / "11-2-big.txt" == Path(second.result_path)
    assert body == path.read_text()
    assert 0o600 == os.stat(path).st_mode & 0o777
    assert 0o700 == os.stat(path.parent).st_mode & 0o777
    assert first.content.startswith(f"[big result: {len(body)} bytes")
    assert "row 0\nrow 1\n" in first.content
    assert "row 9999" in first.content  # the tail
    assert len(first.content.encode()) < output.HEAD_BYTES + output.TAIL_BYTES + 600


def test_a_small_result_stays_inline(ctx, monkeypatch):
    async def small(ctx, args):
        return ToolResult("short")

    _install(monkeypatch, "small", small)
    result = run(ctx, "small")
    assert ("short", "") == (result.content, result.result_path)


def test_redact_arguments_replaces_secret_values():
    register_secret("pa55word-long-value")
    text = registry.redact_arguments({"command": "login --password pa55word-long-value", "n": 3})
    assert {"command": "login --password [redacted]", "n": 3} == json.loads(text)


# ---------------------------------------------------------------- memory


def test_memory_edit_backs_up_the_file_before_editing(ctx):
    pack = ctx.paths.agents_dir / "alice"
    before = (pack / "MEMORY.md").read_text()
    result = run(ctx, "memory_edit", file="MEMORY", mode="append", text="- likes green tea")
    assert "ok" == result.outcome
    assert before + "- likes green tea\n" == (pack / "MEMORY.md").read_text()
    backups = list((ctx.paths.backups_dir / "alice").iterdir())
    assert 1 == len(backups)
    assert backups[0].name.endswith("-MEMORY.md")
    assert time.strftime("%Y-%m-%d-", time.gmtime()) in backups[0].name
    assert before == backups[0].read_text()
    assert 0o600 == os.stat(backups[0]).st_mode & 0o777


def test_two_edits_in_one_second_keep_two_backups(ctx):
    run(ctx, "memory_edit", file="MEMORY", mode="append", text="one")
    run(ctx, "memory_edit", file="MEMORY", mode="append", text="two")
    backups = sorted(p.read_text() for p in (ctx.paths.backups_dir / "alice").iterdir())
    assert 2 == len(backups)
    assert any(b.endswith("one\n") for b in backups)


def test_memory_replace_whole_and_passage(ctx):
    run(ctx, "memory_edit", file="MEMORY", mode="replace", text="# Memory\n- a\n- b\n")
    run(ctx, "memory_edit", file="MEMORY", mode="replace", old="- a\n", text="- A\n")
    assert "# Memory\n- A\n- b\n" == run(ctx, "memory_read", file="MEMORY").content


def test_memory_replace_of_an_ambiguous_passage_is_an_error(ctx):
    run(ctx, "memory_edit", file="MEMORY", mode="replace", text="x\nx\n")
    result = run(ctx, "memory_edit", file="MEMORY", mode="replace", old="x", text="y")
    assert "error" == result.outcome
    assert "occurs 2 times" in result.content


def test_memory_size_bound(ctx):
    result = run(ctx, "memory_edit", file="MEMORY", mode="append", text="z" * (memory.MAX_BYTES + 1))
    assert "error" == result.outcome
    assert "64 KB" in result.content
    assert "zzz" not in (ctx.paths.agents_dir / "alice" / "MEMORY.md").read_text()


def test_memory_file_must_be_memory_or_user(ctx):
    assert "error" == run(ctx, "memory_read", file="SOUL").outcome


def test_people_note_builds_the_people_section():
    text = "# User\n\n- Name: Ann\n"
    text = memory.add_person_note(text, "Bob", "brother, lives in Lyon")
    text = memory.add_person_note(text, "Cara", "colleague")
    text = memory.add_person_note(text, "bob", "birthday 3 May")
    expected = ("# User\n\n- Name: Ann\n\n## People\n\n### Bob\n- brother, lives in Lyon\n- birthday 3 May\n"
                "\n### Cara\n- colleague\n")
    assert expected == text


def test_people_note_keeps_sections_after_people():
    text = "# User\n\n## People\n\n### Bob\n- a\n\n## Work\n- job\n"
    expected = "# User\n\n## People\n\n### Bob\n- a\n- b\n\n### Dan\n- c\n\n## Work\n- job\n"
    assert expected == memory.add_person_note(memory.add_person_note(text, "Bob", "b"), "Dan", "c")


def test_people_note_tool_writes_user_md_with_a_backup(ctx):
    assert "ok" == run(ctx, "people_note", name="Bob", note="brother").outcome
    assert "### Bob\n- brother\n" in (ctx.paths.agents_dir / "alice" / "USER.md").read_text()
    assert [p.name for p in (ctx.paths.backups_dir / "alice").iterdir()][0].endswith("-USER.md")


# ---------------------------------------------------------------- send


def test_send_message_enqueues_for_the_current_chat(ctx, writer):
    assert "ok" == run(ctx, "send_message", text="working on it").outcome
    expected = m.EnqueueOutbox(instance="tg", chat="c1", replies=[m.Reply(text="working on it")], session_id=5)
    assert [expected] == writer.ops


def test_send_file_queues_a_private_copy(ctx, writer):
    (ctx.paths.private_workspace("alice") / "report.txt").write_text("numbers")
    result = run(ctx, "send_file", path="private/report.txt", caption="the report")
    assert "ok" == result.outcome
    (op,) = writer.ops
    copy = Path(op.replies[0].file_path)
    assert ctx.paths.attachments_dir / "alice" in copy.parents
    assert ("the report", "numbers") == (op.replies[0].text, copy.read_text())
    assert 0o600 == os.stat(copy).st_mode & 0o777
    assert [copy] == result.files


@pytest.mark.parametrize("path", ["../../data/secrets.json", "/etc/passwd", "private/../../bob/x"])
def test_send_file_is_confined_like_the_file_tools(ctx, writer, path):
    ctx.paths.secrets_file.write_text("{}")
    assert "refused" == run(ctx, "send_file", path=path).outcome
    assert [] == writer.ops


def test_send_file_through_a_symlink_to_data_is_refused(ctx, writer):
    ctx.paths.secrets_file.write_text("{}")
    os.symlink(ctx.paths.secrets_file, ctx.paths.shared_workspace / "s.json")
    assert "refused" == run(ctx, "send_file", path="s.json").outcome
    assert [] == writer.ops


# ---------------------------------------------------------------- cron: checks before sending


@pytest.mark.parametrize("args,fragment", [
    ({"schedule": "61 * * * *"}, "invalid cron expression"),
    ({"schedule": "* * * * * *"}, "five fields"),
    ({"schedule": "0 9 * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ({"schedule": "0 9 * * *", "tz": "../../etc/passwd"}, "unknown time zone"),
    ({"run_at": "tomorrow"}, "invalid run_at"),
    ({"run_at": "2001-01-01T00:00Z"}, "in the past"),
    ({}, "either schedule"),
    ({"schedule": "0 9 * * *", "run_at": "2099-01-01T00:00Z"}, "either schedule"),
    ({"schedule": "0 9 * * *", "deliver_to": "nocolon"}, "instance:chat"),
])
def test_cron_create_checks_before_sending(ctx, writer, args, fragment):
    result = run(ctx, "cron_create", name="daily", prompt="summarise", **args)
    assert "error" == result.outcome
    assert fragment in result.content
    assert [] == writer.ops


def test_cron_create_to_another_chat_needs_approval(ctx, writer):
    result = run(ctx, "cron_create", name="x", prompt="p", schedule="@daily", deliver_to="tg:C2")
    assert "needs_approval" == result.outcome
    assert "tg:C2" in result.approval_reason
    assert [] == writer.ops


def test_cron_create_to_an_unconfigured_gateway_is_refused(ctx, writer):
    result = run(ctx, "cron_create", name="x", prompt="p", schedule="@daily", deliver_to="slack:C1")
    assert ("error", True) == (result.outcome, "unknown gateway instance 'slack'" in result.content)
    assert [] == writer.ops


# ---------------------------------------------------------------- against a real writer: cron, jobs, recall


@pytest.fixture
def real(writer_home):
    """(home, reader connection) of the module's running writer."""
    reader = db.wait_for_schema(writer_home.paths.db_file, timeout_s=10)
    yield writer_home, reader
    reader.close()


def test_cron_create_list_remove(real):
    home, reader = real

    async def scenario():
        async with home.client() as client:
            ctx = make_ctx(home, call=client.call, reader=lambda: reader)
            created = await registry.execute(ctx, "cron_create", {
                "name": "morning-brief", "prompt": "Give me the news", "schedule": "0 8 * * mon-fri",
                "tz": "Europe/Paris"})
            once = await registry.execute(ctx, "cron_create", {
                "name": "dentist", "prompt": "Remind me of the dentist", "run_at": "2099-03-01T09:30"})
            again = await registry.execute(ctx, "cron_create", {"name": "dentist", "prompt": "x", "schedule": "@daily"})
            listed = await registry.execute(ctx, "cron_list", {})
            other = make_ctx(home, agent="bob", call=client.call, reader=lambda: reader)
            foreign_list = await registry.execute(other, "cron_list", {})
            foreign_remove = await registry.execute(other, "cron_remove", {"name": "dentist"})
            removed = await registry.execute(ctx, "cron_remove", {"name": "dentist"})
            after = await registry.execute(ctx, "cron_list", {})
            return created, once, again, listed, foreign_list, foreign_remove, removed, after

    created, once, again, listed, foreign_list, foreign_remove, removed, after = asyncio.run(scenario())
    assert ("ok", "ok") == (created.outcome, once.outcome)
    assert "first run" in created.content
    assert "+01:00" in created.content or "+02:00" in created.content  # Paris time
    assert "error" == again.outcome
    assert "already exists" in again.content
    lines = listed.content.splitlines()
    assert 2 == len(lines)
    assert lines[0].startswith("- dentist: once at 2099-03-01T09:30+00:00 → tg:c1: Remind me")
    assert lines[1].startswith("- morning-brief: '0 8 * * mon-fri' Europe/Paris, next ")
    assert "you have no cron jobs" == foreign_list.content
    assert "error" == foreign_remove.outcome
    assert "ok" == removed.outcome
    assert 1 == len(after.content.splitlines())


def _wait(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_job_start_records_the_job_and_its_end(real):
    home, reader = real

    async def scenario():
        async with home.client() as client:
            ctx = make_ctx(home, call=client.call, reader=lambda: reader, session_id=0)
            started = await registry.execute(ctx, "job_start", {"command": "echo job-output; ls"})
            job_id = int(started.content.split()[2])
            for _ in range(250):  # the watcher sends JobEnded when the command exits
                status = await registry.execute(ctx, "job_status", {"job_id": job_id})
                if "done" in status.content.splitlines()[0]:
                    break
                await asyncio.sleep(0.02)
            other = make_ctx(home, agent="bob", call=client.call, reader=lambda: reader)
            foreign = await registry.execute(other, "job_status", {"job_id": job_id})
            return started, status, foreign

    started, status, foreign = asyncio.run(scenario())
    assert "ok" == started.outcome
    log_path = Path(started.content.split("output goes to ")[1].split(". Check")[0])
    assert home.paths.jobs_dir == log_path.parent
    assert 0o600 == os.stat(log_path).st_mode & 0o777
    assert status.content.splitlines()[0].endswith("done, exit code 0")
    assert "job-output" in status.content
    assert "error" == foreign.outcome


def test_job_start_classes_like_the_shell(real):
    home, reader = real
    fake = FakeWriter()
    ctx = make_ctx(home, call=fake.call, reader=lambda: reader)
    assert "needs_approval" == run(ctx, "job_start", command="pip install requests").outcome
    ctx.approved = True
    assert "refused" == run(ctx, "job_start", command="rm -rf ~").outcome
    assert [] == fake.ops


def test_a_failed_job_is_recorded_as_failed(real):
    home, reader = real

    async def scenario():
        async with home.client() as client:
            ctx = make_ctx(home, call=client.call, reader=lambda: reader, session_id=0)
            started = await registry.execute(ctx, "job_start", {"command": "ls no-such-file"})
            job_id = int(started.content.split()[2])
            for _ in range(250):
                status = await registry.execute(ctx, "job_status", {"job_id": job_id})
                if "running" not in status.content.splitlines()[0]:
                    return status
                await asyncio.sleep(0.02)
            return status

    status = asyncio.run(scenario())
    assert status.content.splitlines()[0].endswith("failed, exit code 2")


def test_recall_search_finds_this_agents_turns_only(real):
    home, reader = real

    async def scenario():
        async with home.client() as client:
            await client.call(m.Inbound(agent="alice", instance="tg", chat="recall-a", sender="u1",
                                        dedupe_keys=["recall-1"], text="the pelican migration starts in spring"))
            await client.call(m.Inbound(agent="bob", instance="tg", chat="recall-b", sender="u2",
                                        dedupe_keys=["recall-2"], text="a pelican secret of bob"))
            ctx = make_ctx(home, call=client.call, reader=lambda: reader)
            return (await registry.execute(ctx, "recall_search", {"query": "pelican"}),
                    await registry.execute(ctx, "recall_search", {"query": "albatross"}))

    found, missing = asyncio.run(scenario())
    lines = found.content.splitlines()
    assert 1 == len(lines)
    assert "user" in lines[0] and "the pelican migration starts in spring" in lines[0]
    assert "session " in lines[0] and "turn " in lines[0]
    assert "nothing found" in missing.content
