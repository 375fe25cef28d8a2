"""Error texts for the model carry no absolute path of the home: home_paths.relative, and every result
through registry.execute that is not "ok" (an exception's message, a refusal, a tool's error text)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from common.home import paths_for
from services.runner.llm import ToolSpec
from services.runner.tools import home_paths, registry
from services.runner.tools.base import Tool, ToolContext, ToolError, ToolResult
from tests.tool_helpers import make_ctx, no_secrets_from_other_tests  # noqa: F401 - a fixture


@pytest.fixture
def ctx(home) -> ToolContext:
    return make_ctx(home, agent="alice", session_id=5)


def test_each_folder_of_the_home_is_shown_by_its_name(ctx):
    p = ctx.paths
    cases = {
        f"{p.private_workspace('alice')}/notes/a.txt": "private/notes/a.txt",
        f"{p.shared_workspace}/report.md": "shared/report.md",
        f"{p.tool_output_dir}/5/11-1-shell.txt": "tool-output/11-1-shell.txt",
        f"{p.tool_output_dir}/9/1-1-shell.txt": "data/tool-output/9/1-1-shell.txt",
        f"{p.private_workspace('bob')}/diary.md": "workspace/private/bob/diary.md",
        f"{p.data_dir}/secrets.json": "data/secrets.json",
        f"{p.agents_dir}/alice/SOUL.md": "agents/alice/SOUL.md",
        f"{p.workspace_dir}": "workspace",
        f"{p.home}/config.toml": "home/config.toml",
    }
    for absolute, shown in cases.items():
        assert shown == home_paths.relative(ctx, absolute)


def test_paths_inside_sentences_quotes_and_tracebacks_are_rewritten(ctx):
    private = ctx.paths.private_workspace("alice")
    text = (f"[Errno 2] No such file or directory: '{private}/x.py'\n"
            f'  File "{ctx.paths.shared_workspace}/lib.py", line 3, in <module>\n'
            f"cd {ctx.paths.data_dir}; ls {ctx.paths.home}:")
    shown = home_paths.relative(ctx, text)
    assert str(ctx.paths.home) not in shown
    for fragment in ("'private/x.py'", '"shared/lib.py"', "cd data;", "ls home:"):
        assert fragment in shown, shown


def test_a_longer_name_that_only_starts_like_the_home_is_left_alone(ctx):
    other = f"{ctx.paths.home}-backup/file and {ctx.paths.shared_workspace}2/x"
    shown = home_paths.relative(ctx, other)
    assert f"{ctx.paths.home}-backup/file" in shown
    assert "workspace/shared2/x" in shown  # the workspace prefix matched, shared/ did not


def test_the_real_path_of_a_home_reached_through_a_symlink_is_rewritten_too(home, tmp_path):
    link = tmp_path / "link-to-home"
    link.symlink_to(home.root)
    ctx = make_ctx(home, agent="alice")
    ctx.paths = paths_for(link, home.cfg)  # the configured path is the link; errors quote the real one
    real_private = os.path.realpath(ctx.paths.private_workspace("alice"))
    assert "private/x" == home_paths.relative(ctx, f"{real_private}/x")
    assert "private/x" == home_paths.relative(ctx, f"{ctx.paths.private_workspace('alice')}/x")


# ---------------------------------------------------------------- through the registry


def _install(monkeypatch, name: str, run_fn) -> None:
    tool = Tool(ToolSpec(name, "test tool", {"type": "object", "properties": {}}), "files", run_fn)
    monkeypatch.setitem(registry.TOOLS, name, tool)


def run(ctx: ToolContext, tool: str, **args) -> ToolResult:
    return asyncio.run(registry.execute(ctx, tool, args))


def test_an_os_error_inside_a_tool_reaches_the_model_with_relative_paths(ctx, monkeypatch):
    async def opener(ctx, args):
        open(ctx.paths.private_workspace(ctx.agent) / "missing.txt")  # FileNotFoundError quotes the full path

    _install(monkeypatch, "opener", opener)
    result = run(ctx, "opener")
    assert "error" == result.outcome
    assert str(ctx.paths.home) not in result.content
    assert "opener failed: FileNotFoundError: [Errno 2] No such file or directory: 'private/missing.txt'" == (
        result.content)


def test_error_texts_of_tools_are_rewritten(ctx, monkeypatch):
    data = ctx.paths.data_dir

    async def refusing(ctx, args):
        raise ToolError(f"cannot write {data}/jobs/7.log")

    async def chatty(ctx, args):
        return ToolResult(f"ls: cannot access '{ctx.paths.private_root}/bob': Permission denied", outcome="error")

    _install(monkeypatch, "refusing", refusing)
    _install(monkeypatch, "chatty", chatty)
    assert "cannot write data/jobs/7.log" == run(ctx, "refusing").content
    assert "ls: cannot access 'workspace/private/bob': Permission denied" == run(ctx, "chatty").content


def test_a_refused_absolute_path_is_echoed_relative(ctx):
    secret_file = ctx.paths.data_dir / "secrets.json"
    result = run(ctx, "file_read", path=str(secret_file))
    assert ("refused", False, True) == (result.outcome, str(ctx.paths.home) in result.content,
                                       "'data/secrets.json'" in result.content)


def test_a_successful_result_is_left_as_the_tool_wrote_it(ctx, monkeypatch):
    async def pwd(ctx, args):
        return ToolResult(str(ctx.paths.private_workspace(ctx.agent)))

    _install(monkeypatch, "pwd", pwd)
    assert str(ctx.paths.private_workspace("alice")) == run(ctx, "pwd").content


def test_a_large_error_saved_to_tool_output_holds_relative_paths_too(ctx, monkeypatch):
    line = f"{ctx.paths.shared_workspace}/file\n"

    async def big(ctx, args):
        return ToolResult(line * 5000, outcome="error")

    _install(monkeypatch, "big", big)
    result = run(ctx, "big")
    saved = Path(result.result_path).read_text()
    assert str(ctx.paths.home) not in result.content and str(ctx.paths.home) not in saved
    assert saved.startswith("shared/file\n")
