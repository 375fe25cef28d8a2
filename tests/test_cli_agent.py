"""`starling agent new|list` and common.personas: persona packs with private modes, refusals, copies."""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from common.cli.main import main
from common.config import default_config_text

TELEGRAM = '\n[[gateways.telegram]]\nid = "main"\nagent = "helper"\n'


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def root(tmp_path, capsys) -> Path:
    root = tmp_path / "home"
    assert 0 == main(["--home", str(root), "init"])
    capsys.readouterr()
    return root


def test_new_creates_every_pack_file(capsys, root):
    cli(capsys, "--home", str(root), "agent", "new", "helper")
    expected = ["AGENTS.md", "IDENTITY.md", "MEMORY.md", "SOUL.md", "USER.md", "config.toml", "skills", "skills.toml"]
    assert expected == sorted(p.name for p in (root / "agents/helper").iterdir())


def test_new_pack_files_are_0600_and_folders_0700(capsys, root):
    cli(capsys, "--home", str(root), "agent", "new", "helper")
    pack = root / "agents/helper"
    modes = {p.name: mode(p) for p in [pack, *pack.iterdir()]}
    expected = {name: (0o700 if name in ("helper", "skills") else 0o600) for name in modes}
    assert expected == modes


def test_new_creates_the_private_workspace_and_scratchpad(capsys, root):
    cli(capsys, "--home", str(root), "agent", "new", "helper")
    private = root / "workspace/private/helper"
    assert (0o700, 0o700) == (mode(private), mode(private / ".scratchpad"))


def test_new_identity_names_the_agent(capsys, root):
    cli(capsys, "--home", str(root), "agent", "new", "helper")
    assert "Name: helper" in (root / "agents/helper/IDENTITY.md").read_text()


def test_new_agent_config_holds_the_documented_keys(capsys, root):
    cli(capsys, "--home", str(root), "agent", "new", "helper")
    cfg = tomllib.loads((root / "agents/helper/config.toml").read_text())
    expected = {"provider": "default", "model": "", "mcp": [], "web_allow": [], "approval": {"mode": "ask"},
                "tools": ["files", "shell", "memory", "recall", "send", "cron", "jobs", "web", "skills"]}
    assert expected == cfg


def test_new_skills_list_starts_empty(capsys, root):
    cli(capsys, "--home", str(root), "agent", "new", "helper")
    assert {"skills": []} == tomllib.loads((root / "agents/helper/skills.toml").read_text())


def test_new_refuses_an_existing_agent_and_keeps_it(capsys, root):
    (root / "agents/default/SOUL.md").write_text("mine")
    rc, _, err = cli(capsys, "--home", str(root), "agent", "new", "default")
    assert (1, "mine", True) == (rc, (root / "agents/default/SOUL.md").read_text(), "already exists" in err)


def test_new_refuses_an_invalid_id(capsys, root):
    rc, _, err = cli(capsys, "--home", str(root), "agent", "new", "Bad Name")
    assert (1, False, True) == (rc, (root / "agents/Bad Name").exists(), "invalid agent id" in err)


def test_new_from_copies_the_persona_but_not_the_memory(capsys, root):
    (root / "agents/default/SOUL.md").write_text("dry wit")
    (root / "agents/default/MEMORY.md").write_text("# Memory\n\n- the person likes tea\n")
    cli(capsys, "--home", str(root), "agent", "new", "twin", "--from", "default")
    twin = root / "agents/twin"
    assert ("dry wit", "# Memory\n") == ((twin / "SOUL.md").read_text(), (twin / "MEMORY.md").read_text())


def test_new_from_a_missing_agent_fails_and_creates_nothing(capsys, root):
    rc, _, _ = cli(capsys, "--home", str(root), "agent", "new", "twin", "--from", "nobody")
    assert (1, False) == (rc, (root / "agents/twin").exists())


def test_list_shows_each_agent_and_its_gateways(capsys, root):
    (root / "config.toml").write_text(default_config_text() + TELEGRAM)
    cli(capsys, "--home", str(root), "agent", "new", "helper")
    _, out, _ = cli(capsys, "--home", str(root), "agent", "list", "--json")
    rows = {row["id"]: (row["gateways"], len(row["files"])) for row in json.loads(out)}
    assert {"default": ([], 7), "helper": (["main"], 7)} == rows


def test_list_reports_a_missing_pack_that_a_gateway_names(capsys, root):
    (root / "config.toml").write_text(default_config_text() + TELEGRAM)
    _, out, _ = cli(capsys, "--home", str(root), "agent", "list", "--json")
    assert [("default", True), ("helper", False)] == [(r["id"], r["exists"]) for r in json.loads(out)]


def test_list_table_names_missing_files(capsys, root):
    (root / "agents/default/USER.md").unlink()
    _, out, _ = cli(capsys, "--home", str(root), "agent", "list")
    assert "6/7 (no USER.md)" in out


def test_bare_agent_lists(capsys, root):
    _, out, _ = cli(capsys, "--home", str(root), "agent")
    assert "default" in out.splitlines()[1]
