"""`starling init`: a private home with a commented config, tokens and a default agent; safe to run again."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from common.cli.main import main
from common.config import default_config_text


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("SESSION_SECRET", raising=False)
    return tmp_path / "home"


def test_init_creates_private_folders(capsys, root):
    assert 0 == cli(capsys, "--home", str(root), "init")[0]
    folders = [root, root / "data", root / "data/run", root / "data/credentials", root / "data/logs",
               root / "agents", root / "agents/default", root / "workspace/private/default/.scratchpad"]
    assert [0o700] * len(folders) == [mode(f) for f in folders]


def test_init_creates_private_files(capsys, root):
    cli(capsys, "--home", str(root), "init")
    files = [root / "config.toml", root / "data/.control-token", root / "data/.session-secret",
             root / "agents/default/SOUL.md"]
    assert [0o600] * len(files) == [mode(f) for f in files]


def test_init_writes_the_commented_default_config(capsys, root):
    cli(capsys, "--home", str(root), "init")
    assert default_config_text() == (root / "config.toml").read_text()


def test_init_creates_the_default_agent_pack(capsys, root):
    cli(capsys, "--home", str(root), "init")
    expected = {"IDENTITY.md", "SOUL.md", "USER.md", "AGENTS.md", "MEMORY.md", "config.toml", "skills.toml", "skills"}
    assert expected == {p.name for p in (root / "agents/default").iterdir()}


def test_init_again_keeps_config_tokens_and_agent(capsys, root):
    cli(capsys, "--home", str(root), "init")
    edited = default_config_text() + "# my own note\n"
    (root / "config.toml").write_text(edited)
    (root / "agents/default/SOUL.md").write_text("mine")
    token = (root / "data/.control-token").read_bytes()
    rc, out, _ = cli(capsys, "--home", str(root), "init")
    after = ((root / "config.toml").read_text(), (root / "data/.control-token").read_bytes(),
             (root / "agents/default/SOUL.md").read_text())
    assert (0, (edited, token, "mine")) == (rc, after)


def test_init_again_says_the_config_exists(capsys, root):
    cli(capsys, "--home", str(root), "init")
    _, out, _ = cli(capsys, "--home", str(root), "init")
    assert "config.toml (exists" in out


def test_init_again_tightens_a_loosened_folder(capsys, root):
    cli(capsys, "--home", str(root), "init")
    os.chmod(root / "data/run", 0o755)
    cli(capsys, "--home", str(root), "init")
    assert 0o700 == mode(root / "data/run")


def test_init_force_replaces_the_config(capsys, root):
    cli(capsys, "--home", str(root), "init")
    (root / "config.toml").write_text("[runner]\nprocesses = 3\n")
    cli(capsys, "--home", str(root), "init", "--force")
    assert default_config_text() == (root / "config.toml").read_text()


def test_init_with_an_invalid_existing_config_fails_naming_the_key(capsys, root):
    root.mkdir()
    (root / "config.toml").write_text("[runner]\nprocesses = 0\n")
    rc, _, err = cli(capsys, "--home", str(root), "init")
    assert (1, True) == (rc, "runner.processes" in err)


def test_init_prints_the_next_steps(capsys, root):
    _, out, _ = cli(capsys, "--home", str(root), "init")
    steps = ["secret set openai --value-stdin", " up ", " chat "]
    assert [True, True, True] == [step in out for step in steps]


def test_init_leaves_the_session_secret_to_the_environment_when_set(capsys, root, monkeypatch):
    monkeypatch.setenv("SESSION_SECRET", "from-the-environment")
    cli(capsys, "--home", str(root), "init")
    assert False is (root / "data/.session-secret").exists()
