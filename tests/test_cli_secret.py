"""`starling secret [set|rm]`: names and sources only; values go to secrets.json (0600) and nowhere else."""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from common.cli.main import main
from tests.procs import REPO

VALUE = "sk-test-9f8e7d6c5b4a-never-shown"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run(root: Path, *argv: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(root), *argv], input=stdin,
                          capture_output=True, text=True, cwd=REPO, timeout=30)


@pytest.fixture
def root(tmp_path, capsys, monkeypatch) -> Path:
    for var in ("OPENAI", "STARLING_SECRET_OPENAI"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "home"
    assert 0 == main(["--home", str(root), "init"])
    capsys.readouterr()
    return root


def stored(root: Path) -> dict[str, str]:
    return json.loads((root / "data/secrets.json").read_text())


def set_from_stdin(capsys, monkeypatch, root: Path, name: str, text: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    return cli(capsys, "--home", str(root), "secret", "set", name, "--value-stdin")


def test_set_list_rm_never_show_the_value(capsys, monkeypatch, root):
    # logs written by services in this home would sit under data/logs: plant one to prove the scan looks there
    (root / "data/logs/writer.log").write_text('{"event": "ready"}\n')
    shown = [set_from_stdin(capsys, monkeypatch, root, "openai", VALUE + "\n")]
    shown.append(cli(capsys, "--home", str(root), "secret"))
    shown.append(cli(capsys, "--home", str(root), "secret", "--json"))
    shown.append(cli(capsys, "--home", str(root), "secret", "rm", "openai"))
    files = [p for p in root.rglob("*") if p.is_file()]
    leaks = [str(p) for p in files if VALUE.encode() in p.read_bytes()]
    assert ([0, 0, 0, 0], [], []) == ([rc for rc, _, _ in shown], [s for s in shown if VALUE in s[1] + s[2]], leaks)


def test_set_from_stdin_stores_the_value_without_its_newline(capsys, monkeypatch, root):
    set_from_stdin(capsys, monkeypatch, root, "openai", VALUE + "\n")
    assert {"openai": VALUE} == stored(root)


def test_set_from_stdin_strips_only_one_trailing_newline(capsys, monkeypatch, root):
    set_from_stdin(capsys, monkeypatch, root, "pem", "line one\nline two\n\n")
    assert {"pem": "line one\nline two\n"} == stored(root)


def test_secrets_file_is_0600(capsys, monkeypatch, root):
    set_from_stdin(capsys, monkeypatch, root, "openai", VALUE)
    assert 0o600 == stat.S_IMODE(os.stat(root / "data/secrets.json").st_mode)


def test_set_with_value_warns_about_shell_history(capsys, root):
    rc, out, err = cli(capsys, "--home", str(root), "secret", "set", "openai", "--value", VALUE)
    assert (0, True, False) == (rc, "shell history" in err, VALUE in out + err)


def test_set_with_value_stores_it(capsys, root):
    cli(capsys, "--home", str(root), "secret", "set", "openai", "--value", VALUE)
    assert {"openai": VALUE} == stored(root)


def test_set_without_a_value_source_is_a_usage_error(root):
    assert 2 == run(root, "secret", "set", "openai").returncode


def test_set_with_both_value_sources_is_a_usage_error(root):
    result = run(root, "secret", "set", "openai", "--value", VALUE, "--value-stdin", stdin=VALUE)
    assert (2, False) == (result.returncode, VALUE in result.stdout + result.stderr)


def test_set_refuses_an_empty_value(root):
    result = run(root, "secret", "set", "openai", "--value-stdin", stdin="\n")
    assert (1, False) == (result.returncode, (root / "data/secrets.json").exists())


def test_rm_of_an_absent_secret_exits_1(root):
    result = run(root, "secret", "rm", "nothing-here")
    assert (1, True) == (result.returncode, "nothing-here" in result.stderr)


def test_rm_removes_only_that_secret(capsys, monkeypatch, root):
    set_from_stdin(capsys, monkeypatch, root, "openai", VALUE)
    set_from_stdin(capsys, monkeypatch, root, "slack-bot", "xoxb-other")
    cli(capsys, "--home", str(root), "secret", "rm", "openai")
    assert {"slack-bot": "xoxb-other"} == stored(root)


def test_list_shows_missing_file_and_env_sources_with_their_config_key(capsys, monkeypatch, root):
    set_from_stdin(capsys, monkeypatch, root, "spare", VALUE)
    monkeypatch.setenv("STARLING_SECRET_OPENAI", "from-env")
    _, out, _ = cli(capsys, "--home", str(root), "secret", "--json")
    expected = [{"name": "openai", "source": "env", "referenced_by": "providers.default.api_key"},
                {"name": "spare", "source": "file", "referenced_by": ""}]
    assert expected == json.loads(out)


def test_list_table_marks_a_referenced_secret_missing(capsys, root):
    _, out, _ = cli(capsys, "--home", str(root), "secret")
    assert ["openai", "missing", "providers.default.api_key"] == out.splitlines()[1].split()
