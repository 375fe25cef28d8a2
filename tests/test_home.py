"""Tests for common.home: home resolution, derived paths, layout modes, private files."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from common.config import Config, SessionMemory
from common.errors import StarlingError
from common.home import ensure_layout, ensure_token_file, paths_for, resolve_home, write_private_file


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_resolve_home_prefers_argument(monkeypatch, tmp_path):
    monkeypatch.setenv("STARLING_HOME", str(tmp_path / "env"))
    assert tmp_path / "arg" == resolve_home(str(tmp_path / "arg"))


def test_resolve_home_uses_env(monkeypatch, tmp_path):
    monkeypatch.setenv("STARLING_HOME", str(tmp_path / "env"))
    assert tmp_path / "env" == resolve_home(None)


def test_resolve_home_defaults_to_dot_starling(monkeypatch, tmp_path):
    monkeypatch.delenv("STARLING_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tmp_path / ".starling" == resolve_home(None)


def test_resolve_home_makes_relative_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert tmp_path / "h" == resolve_home("h")


def test_paths_relative_to_home(tmp_path):
    paths = paths_for(tmp_path, Config())
    assert (tmp_path / "data" / "starling.db", tmp_path / "agents", tmp_path / "workspace" / "shared") == (
        paths.db_file, paths.agents_dir, paths.shared_workspace)


def test_paths_absolute_dirs_live_elsewhere(tmp_path):
    cfg = Config(data_dir=str(tmp_path / "disk" / "data"))
    assert tmp_path / "disk" / "data" / "run" == paths_for(tmp_path / "home", cfg).run_dir


def test_named_files(tmp_path):
    p = paths_for(tmp_path, Config())
    expected = [tmp_path / "config.toml"] + [tmp_path / "data" / n for n in (
        "secrets.json", ".control-token", ".session-secret", "backups/agents")]
    assert expected == [p.config_file, p.secrets_file, p.control_token_file, p.session_secret_file, p.backups_dir]


def test_private_workspace(tmp_path):
    assert tmp_path / "workspace" / "private" / "bob" == paths_for(tmp_path, Config()).private_workspace("bob")


def test_private_workspace_rejects_traversal(tmp_path):
    with pytest.raises(ValueError):
        paths_for(tmp_path, Config()).private_workspace("../bob")


def test_memories_dir_resolved_when_enabled(tmp_path):
    cfg = Config(session_memory=SessionMemory(active_dir="mem"))
    assert (tmp_path / "mem", True) == (paths_for(tmp_path, cfg).memories_dir, paths_for(tmp_path, cfg).memories_enabled)


def test_ensure_layout_creates_every_folder_0700(tmp_path):
    paths = paths_for(tmp_path / "home", Config())
    ensure_layout(paths)
    assert {0o700} == {mode(d) for d in paths.layout()}


def test_ensure_layout_ignores_umask(tmp_path):
    paths = paths_for(tmp_path / "home", Config())
    old = os.umask(0o000)
    try:
        ensure_layout(paths)
    finally:
        os.umask(old)
    assert (0o700, 0o700) == (mode(paths.run_dir), mode(paths.credentials_dir))


def test_ensure_layout_tightens_loose_folders(tmp_path):
    paths = paths_for(tmp_path / "home", Config())
    paths.run_dir.mkdir(parents=True)
    os.chmod(paths.run_dir, 0o755)
    ensure_layout(paths)
    assert 0o700 == mode(paths.run_dir)


def test_ensure_layout_is_idempotent(tmp_path):
    paths = paths_for(tmp_path / "home", Config())
    ensure_layout(paths)
    ensure_layout(paths)
    assert {0o700} == {mode(d) for d in paths.layout()}


def test_ensure_layout_honours_dirs_elsewhere(tmp_path):
    cfg = Config(data_dir=str(tmp_path / "disk" / "data"), workspace_dir=str(tmp_path / "ws"))
    ensure_layout(paths_for(tmp_path / "home", cfg))
    assert (True, True, False) == (
        (tmp_path / "disk" / "data" / "credentials").is_dir(),
        (tmp_path / "ws" / "private").is_dir(),
        (tmp_path / "home" / "data").exists(),
    )


def test_memories_folder_only_when_enabled(tmp_path):
    ensure_layout(paths_for(tmp_path, Config()))
    assert False is (tmp_path / "memories").exists()


def test_write_private_file_content_and_mode(tmp_path):
    path = tmp_path / "f"
    write_private_file(path, b"hello")
    assert (b"hello", 0o600) == (path.read_bytes(), mode(path))


def test_write_private_file_replaces_and_tightens(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    os.chmod(path, 0o644)
    write_private_file(path, b"new")
    assert (b"new", 0o600) == (path.read_bytes(), mode(path))


def test_write_private_file_leaves_no_temp_files(tmp_path):
    write_private_file(tmp_path / "f", b"x")
    assert ["f"] == os.listdir(tmp_path)


def test_write_private_file_ignores_umask(tmp_path):
    old = os.umask(0o000)
    try:
        write_private_file(tmp_path / "f", b"x")
    finally:
        os.umask(old)
    assert 0o600 == mode(tmp_path / "f")


def test_ensure_token_file_creates_urlsafe_0600(tmp_path):
    token = ensure_token_file(tmp_path / "t")
    assert (0o600, True, True) == (
        mode(tmp_path / "t"), len(token) >= 43, token.decode().replace("-", "").replace("_", "").isalnum())


def test_ensure_token_file_is_stable(tmp_path):
    assert ensure_token_file(tmp_path / "t") == ensure_token_file(tmp_path / "t")


def test_ensure_token_file_reads_existing(tmp_path):
    (tmp_path / "t").write_bytes(b"given-token\n")
    assert b"given-token" == ensure_token_file(tmp_path / "t")


def test_ensure_token_file_concurrent_callers_agree(tmp_path):
    results: list[bytes] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_token_file(tmp_path / "t"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (1, ["t"]) == (len(set(results)), os.listdir(tmp_path))


def test_ensure_layout_failure_is_a_starling_error(tmp_path):
    (tmp_path / "home").write_text("a file where home should be")
    with pytest.raises(StarlingError) as info:
        ensure_layout(paths_for(tmp_path / "home", Config()))
    assert str(info.value).startswith(f"{tmp_path / 'home'}: cannot create or secure folder")
