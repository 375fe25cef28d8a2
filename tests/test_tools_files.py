"""The file tools (services/runner/tools/files.py, confine.py): every escape refused, ordinary use works."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from services.runner.tools import confine, output, registry
from services.runner.tools.base import ToolContext, ToolResult
from tests.tool_helpers import FakeWriter, make_ctx, no_secrets_from_other_tests  # noqa: F401 - a fixture


@pytest.fixture
def ctx(home) -> ToolContext:
    return make_ctx(home)


def run(ctx: ToolContext, name: str, **args) -> ToolResult:
    return asyncio.run(registry.execute(ctx, name, args))


def shared(ctx: ToolContext) -> Path:
    return ctx.paths.shared_workspace


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def secrets_file(ctx) -> Path:
    path = ctx.paths.secrets_file
    path.write_text('{"openai": "sk-very-secret"}')
    return path


# ---------------------------------------------------------------- ordinary use


def test_write_then_read_in_shared(ctx):
    assert "ok" == run(ctx, "file_write", path="notes/today.md", content="one\ntwo\n").outcome
    assert "one\ntwo\n" == (shared(ctx) / "notes/today.md").read_text()
    result = run(ctx, "file_read", path="notes/today.md")
    assert "ok" == result.outcome
    assert result.content.endswith("one\ntwo\n")


def test_shared_prefix_is_the_same_place(ctx):
    run(ctx, "file_write", path="shared/a.txt", content="x")
    assert "x" == (shared(ctx) / "a.txt").read_text()


def test_private_prefix_writes_in_the_agents_own_folder(ctx):
    run(ctx, "file_write", path="private/draft.md", content="mine")
    assert "mine" == (ctx.paths.private_workspace("alice") / "draft.md").read_text()


def test_new_files_are_0600_and_new_folders_0700(ctx):
    run(ctx, "file_write", path="deep/er/file.txt", content="x")
    assert 0o600 == mode(shared(ctx) / "deep/er/file.txt")
    assert 0o700 == mode(shared(ctx) / "deep/er")
    assert 0o700 == mode(shared(ctx) / "deep")


def test_append_adds_to_the_end(ctx):
    run(ctx, "file_write", path="log.txt", content="a\n")
    run(ctx, "file_write", path="log.txt", content="b\n", append=True)
    assert "a\nb\n" == (shared(ctx) / "log.txt").read_text()


def test_read_pages_with_offset_and_limit(ctx):
    (shared(ctx) / "lines.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    result = run(ctx, "file_read", path="lines.txt", offset=3, limit=2)
    assert ["line 3", "line 4"] == result.content.splitlines()[1:3]
    assert "offset=5" in result.content


def test_read_is_bounded(ctx):
    (shared(ctx) / "big.txt").write_text("x" * 100 + "\n" * 0 + ("y" * 99 + "\n") * 2000)
    result = run(ctx, "file_read", path="big.txt")
    assert len(result.content.encode()) < 70 * 1024
    assert "more follows" in result.content


def test_binary_files_are_not_dumped(ctx):
    (shared(ctx) / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    assert "error" == run(ctx, "file_read", path="blob.bin").outcome


def test_missing_file_is_an_error_not_a_refusal(ctx):
    result = run(ctx, "file_read", path="nope.txt")
    assert ("error", "shared/nope.txt: no such file or folder") == (result.outcome, result.content)


def test_list_shows_folders_and_sizes(ctx):
    (shared(ctx) / "sub").mkdir()
    (shared(ctx) / "sub/inner.txt").write_text("12345")
    (shared(ctx) / "top.txt").write_text("1")
    flat = run(ctx, "file_list").content.splitlines()
    assert ["[shared/]", "sub/", "top.txt  1 B"] == flat
    deep = run(ctx, "file_list", recursive=True).content.splitlines()
    assert "sub/inner.txt  5 B" in deep


def test_search_substring_and_regex(ctx):
    (shared(ctx) / "a.txt").write_text("alpha\nbeta gamma\n")
    (shared(ctx) / "sub").mkdir()
    (shared(ctx) / "sub/b.txt").write_text("Gamma ray\n")
    assert ["shared/a.txt:2: beta gamma"] == run(ctx, "file_search", pattern="gamma").content.splitlines()
    found = run(ctx, "file_search", pattern="gam+a", regex=True, ignore_case=True).content.splitlines()
    assert ["shared/a.txt:2: beta gamma", "shared/sub/b.txt:1: Gamma ray"] == found


def test_search_results_are_bounded(ctx):
    (shared(ctx) / "many.txt").write_text("hit\n" * 500)
    lines = run(ctx, "file_search", pattern="hit").content.splitlines()
    assert 101 == len(lines)  # 100 matches and the note
    assert "stopped at 100" in lines[-1]


def test_a_bad_regex_is_an_error(ctx):
    (shared(ctx) / "a.txt").write_text("x\n")
    result = run(ctx, "file_search", pattern="(", regex=True)
    assert "error" == result.outcome
    assert "invalid regular expression" in result.content


def test_symlink_inside_the_root_is_followed(ctx):
    (shared(ctx) / "real.txt").write_text("inside")
    os.symlink("real.txt", shared(ctx) / "alias.txt")
    assert run(ctx, "file_read", path="alias.txt").content.endswith("inside")


# ---------------------------------------------------------------- escapes


def refused(result: ToolResult) -> bool:
    return result.outcome == "refused" and result.content.startswith("Refused:")


@pytest.mark.parametrize("path", [
    "..",
    "../x",
    "../../data/secrets.json",
    "private/../../../data/secrets.json",
    "notes/../../shared/x",
    "/etc/passwd",
    "/tmp",
    "~/x",
    "private/../bob/notes.md",
])
def test_escapes_by_name_are_refused_for_read(ctx, secrets_file, path):
    assert refused(run(ctx, "file_read", path=path))


@pytest.mark.parametrize("path", ["../x.txt", "../../data/evil.txt", "/tmp/evil.txt", "tool-output/x.txt"])
def test_escapes_by_name_are_refused_for_write(ctx, path):
    assert refused(run(ctx, "file_write", path=path, content="x"))


def test_absolute_path_even_inside_the_workspace_is_refused(ctx):
    (shared(ctx) / "a.txt").write_text("x")
    assert refused(run(ctx, "file_read", path=str(shared(ctx) / "a.txt")))


def test_symlink_to_data_is_refused(ctx, secrets_file):
    os.symlink(ctx.paths.data_dir, shared(ctx) / "d")
    os.symlink(secrets_file, shared(ctx) / "s.json")
    for name in ("file_read", "file_list", "file_search"):
        key = {"file_search": {"pattern": "sk", "path": "d"}}.get(name, {"path": "d/secrets.json"})
        assert refused(run(ctx, name, **key)), name
    assert refused(run(ctx, "file_read", path="s.json"))
    assert refused(run(ctx, "file_write", path="s.json", content="overwritten"))
    assert '{"openai": "sk-very-secret"}' == secrets_file.read_text()


def test_symlink_to_another_agents_private_folder_is_refused(ctx):
    bob = ctx.paths.private_workspace("bob")
    (bob / "diary.md").write_text("bob's")
    os.symlink(bob, shared(ctx) / "bob")
    assert refused(run(ctx, "file_read", path="bob/diary.md"))
    assert refused(run(ctx, "file_list", path="bob"))
    assert refused(run(ctx, "file_write", path="bob/new.md", content="x"))
    assert not (bob / "new.md").exists()


def test_another_agents_private_folder_by_name_is_refused(ctx):
    (ctx.paths.private_workspace("bob") / "diary.md").write_text("bob's")
    assert refused(run(ctx, "file_read", path="private/../bob/diary.md"))
    assert refused(run(ctx, "file_read", path="../private/bob/diary.md"))
    # 'private/bob/…' is inside alice's own folder, not bob's
    assert "error" == run(ctx, "file_read", path="private/bob/diary.md").outcome


def test_symlinked_directory_component_is_refused(ctx, secrets_file):
    (shared(ctx) / "a").mkdir()
    os.symlink(ctx.paths.home, shared(ctx) / "a" / "b")
    assert refused(run(ctx, "file_read", path="a/b/data/secrets.json"))
    assert refused(run(ctx, "file_list", path="a/b/agents"))


def test_writing_a_new_file_through_a_symlinked_parent_is_refused(ctx):
    outside = ctx.paths.home / "outside"
    outside.mkdir()
    os.symlink(outside, shared(ctx) / "out")
    assert refused(run(ctx, "file_write", path="out/new.txt", content="x"))
    assert refused(run(ctx, "file_write", path="out/deeper/new.txt", content="x"))
    assert [] == list(outside.iterdir())


def test_dangling_symlink_pointing_outside_is_refused(ctx):
    os.symlink(ctx.paths.home / "planted.txt", shared(ctx) / "dangling")
    assert refused(run(ctx, "file_write", path="dangling", content="x"))
    assert not (ctx.paths.home / "planted.txt").exists()


def test_agents_folder_is_unreachable_even_through_a_link(ctx):
    os.symlink(ctx.paths.agents_dir, shared(ctx) / "agents")
    assert refused(run(ctx, "file_read", path="agents/alice/MEMORY.md"))


def test_hard_link_to_a_secret_is_refused(ctx, secrets_file):
    os.link(secrets_file, shared(ctx) / "copy.json")
    assert refused(run(ctx, "file_read", path="copy.json"))
    assert refused(run(ctx, "file_write", path="copy.json", content="x", append=True))


def test_a_component_swapped_for_a_symlink_after_the_check_is_not_followed(ctx, secrets_file):
    """The TOCTOU guard: resolve, then swap a folder for a link to data/, then open: the walk fails."""
    (shared(ctx) / "dir").mkdir()
    (shared(ctx) / "dir" / "secrets.json").write_text("harmless")
    target = confine.resolve(ctx, "dir/secrets.json")
    (shared(ctx) / "dir" / "secrets.json").unlink()
    (shared(ctx) / "dir").rmdir()
    os.symlink(ctx.paths.data_dir, shared(ctx) / "dir")
    with pytest.raises(confine.Refused):
        confine.open_read(target)


def test_a_final_component_swapped_for_a_symlink_is_not_followed(ctx, secrets_file):
    (shared(ctx) / "f.json").write_text("harmless")
    target = confine.resolve(ctx, "f.json")
    (shared(ctx) / "f.json").unlink()
    os.symlink(secrets_file, shared(ctx) / "f.json")
    with pytest.raises(confine.Refused):
        confine.open_read(target)


def test_search_skips_symlinks_to_secrets(ctx, secrets_file):
    os.symlink(secrets_file, shared(ctx) / "s.json")
    os.symlink(ctx.paths.data_dir, shared(ctx) / "d")
    (shared(ctx) / "plain.txt").write_text("no secret here\n")
    assert run(ctx, "file_search", pattern="sk-very").content.startswith("no match")


def test_tool_output_folder_is_readable_but_not_writable(ctx):
    big = "z" * (output.INLINE_LIMIT + 10)
    (shared(ctx) / "big.txt").write_text(big)
    result = run(ctx, "file_read", path="big.txt", limit=100000)
    assert "" == result.result_path  # file_read's own bound is larger than the general one
    saved = output.save(ctx, "shell", b"saved-first-qx\nsaved-second-qx\n")
    assert run(ctx, "file_read", path=f"tool-output/{saved.name}").content.endswith("saved-second-qx\n")
    assert refused(run(ctx, "file_write", path=f"tool-output/{saved.name}", content="x"))


def test_listing_a_file_is_an_error_not_a_refusal(ctx):
    (shared(ctx) / "plain.txt").write_text("x")
    result = run(ctx, "file_list", path="plain.txt")
    assert ("error", "shared/plain.txt: Not a directory") == (result.outcome, result.content)


def test_writes_inside_a_git_folder_are_refused(ctx):
    (shared(ctx) / "repo" / ".git").mkdir(parents=True)
    assert refused(run(ctx, "file_write", path="repo/.git/config", content="[core]\n\tfsmonitor = evil\n"))
    assert refused(run(ctx, "file_write", path="repo2/.git", content="gitdir: ../elsewhere\n"))
    assert "ok" == run(ctx, "file_write", path="repo/.gitignore", content="*.tmp\n").outcome
