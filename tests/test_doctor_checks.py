"""`starling doctor`: no false failures (a local model without a key, webhook secrets in polling mode), agent packs,
each service's state under a real supervisord, the control port, and `--fix`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from common.cli.main import main
from common.config import default_config_text, load_config, referenced_secrets, required_secrets
from common.secrets import set_secret
from common.supervisor import Supervisor, expected_services
from tests.procs import REPO, make_home, remove_home, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def doctor(capsys, root: Path, *extra: str) -> tuple[int, dict[str, list[tuple[str, str]]], list[str]]:
    """Exit code, each check's (status, reason) by name, and what --fix changed."""
    rc = main(["--home", str(root), "doctor", "--json", *extra])
    report = json.loads(capsys.readouterr().out)
    checks: dict[str, list[tuple[str, str]]] = {}
    for check in report["checks"]:
        checks.setdefault(check["name"], []).append((check["status"], check["reason"]))
    return rc, checks, report["fixed"]


def failures(checks) -> list[tuple[str, str]]:
    return [(name, reason) for name, found in checks.items() for status, reason in found if status == "fail"]


@pytest.fixture
def root(capsys, monkeypatch) -> Path:
    for var in ("OPENAI", "STARLING_SECRET_OPENAI", "TELEGRAM_MAIN", "STARLING_SECRET_TELEGRAM_MAIN"):
        monkeypatch.delenv(var, raising=False)
    root = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    assert 0 == main(["--home", str(root), "init"])
    capsys.readouterr()
    yield root
    shutil.rmtree(root, ignore_errors=True)


def with_config(root: Path, extra: str, base: str | None = None) -> None:
    (root / "config.toml").write_text((base or default_config_text()) + "\n" + extra)


# ------------------------------------------------------------------ secrets by mode


LOCAL_PROVIDER = default_config_text().replace('base_url = "https://api.openai.com/v1"',
                                               'base_url = "http://127.0.0.1:11434/v1"')


def test_a_local_model_without_a_key_is_not_a_failure(capsys, root):
    with_config(root, "", base=LOCAL_PROVIDER)
    rc, checks, _ = doctor(capsys, root)
    assert (0, [], True) == (rc, failures(checks),
                             any("none needed" in reason for status, reason in checks["secrets"]))


def test_a_remote_model_without_a_key_still_fails(capsys, root):
    rc, checks, _ = doctor(capsys, root)
    assert (1, True) == (rc, any(r.startswith("'openai' (providers.default.api_key) is not set")
                                 for s, r in checks["secrets"] if s == "fail"))


POLLING_BOT = '[[gateways.telegram]]\nid = "main"\ntoken = "telegram-main"\nmode = "polling"\n'


def test_a_polling_telegram_bot_needs_no_webhook_secret(capsys, root):
    with_config(root, POLLING_BOT)
    set_secret(root / "data/secrets.json", "openai", "sk-test-value")
    set_secret(root / "data/secrets.json", "telegram-main", "123:abc")
    rc, checks, _ = doctor(capsys, root)
    assert (0, []) == (rc, failures(checks))


def test_a_webhook_telegram_bot_needs_its_secret_token(capsys, root):
    with_config(root, POLLING_BOT.replace('"polling"', '"webhook"\npublic_url = "https://example.org/tg"'))
    set_secret(root / "data/secrets.json", "openai", "sk-test-value")
    set_secret(root / "data/secrets.json", "telegram-main", "123:abc")
    rc, checks, _ = doctor(capsys, root)
    assert (1, [("secrets", True)]) == (rc, [(n, "gateways.telegram[0].secret_token" in r) for n, r in failures(checks)])


@pytest.mark.parametrize("block, needed, not_needed", [
    ('[[gateways.slack]]\nid = "team"\nmode = "socket"\n', {"slack-bot", "slack-app"}, {"slack-signing"}),
    ('[[gateways.slack]]\nid = "team"\nmode = "events"\n', {"slack-bot", "slack-signing"}, {"slack-app"}),
    ('[[gateways.whatsapp]]\nid = "phone"\nmode = "linked"\n', set(), {"whatsapp-token", "whatsapp-app-secret"}),
    ('[[gateways.whatsapp]]\nid = "phone"\nphone_number_id = "1"\n',
     {"whatsapp-token", "whatsapp-app-secret", "whatsapp-verify"}, set()),
])
def test_required_secrets_follow_the_mode_and_referenced_secrets_keep_every_name(tmp_path, block, needed,
                                                                                 not_needed):
    (tmp_path / "config.toml").write_text(LOCAL_PROVIDER + "\n" + block)
    cfg = load_config(tmp_path / "config.toml")
    required, referenced = set(required_secrets(cfg)), set(referenced_secrets(cfg))
    assert (needed, set(), True) == (required, required & not_needed, (needed | not_needed | {"openai"}) <= referenced)


# ------------------------------------------------------------------ agent packs


def test_a_fresh_home_has_a_complete_default_pack(capsys, root):
    _, checks, _ = doctor(capsys, root)
    [(status, reason)] = checks["agents"]
    assert ("ok", True) == (status, reason.startswith("agent 'default': pack complete"))


def test_an_invalid_approval_mode_fails_naming_the_file_and_key(capsys, root):
    pack_config = root / "agents/default/config.toml"
    pack_config.write_text(pack_config.read_text().replace('mode = "ask"', 'mode = "asks"'))
    rc, checks, _ = doctor(capsys, root)
    [(status, reason)] = checks["agents"]
    assert (1, "fail", True, True, True) == (rc, status, str(pack_config) in reason, "approval.mode" in reason,
                                             "'asks'" in reason)


def test_an_unknown_key_in_a_pack_config_fails(capsys, root):
    pack_config = root / "agents/default/config.toml"
    pack_config.write_text("temperature = 2\n" + pack_config.read_text())
    rc, checks, _ = doctor(capsys, root)
    [(status, reason)] = checks["agents"]
    assert (1, "fail", True) == (rc, status, f"{pack_config}: temperature: unknown key; expected one of: provider,"
                                             in reason)


def test_a_pack_naming_an_unconfigured_provider_fails(capsys, root):
    pack_config = root / "agents/default/config.toml"
    pack_config.write_text(pack_config.read_text().replace('provider = "default"', 'provider = "local"'))
    _, checks, _ = doctor(capsys, root)
    assert [("fail", True)] == [(s, "[providers.local]" in r) for s, r in checks["agents"]]


def test_missing_pack_files_warn(capsys, root):
    (root / "agents/default/SOUL.md").unlink()
    _, checks, _ = doctor(capsys, root)
    assert [("warn", True)] == [(s, "SOUL.md missing" in r) for s, r in checks["agents"]]


def test_a_missing_agents_folder_fails(capsys, root):
    shutil.rmtree(root / "agents")
    rc, checks, _ = doctor(capsys, root)
    assert (1, ["fail"]) == (rc, [s for s, _ in checks["agents"]])


def test_an_agent_a_gateway_names_without_a_pack_fails(capsys, root):
    with_config(root, POLLING_BOT + 'agent = "helper"\n', base=LOCAL_PROVIDER)
    set_secret(root / "data/secrets.json", "telegram-main", "123:abc")
    rc, checks, _ = doctor(capsys, root)
    assert (1, [True]) == (rc, ["'helper' (used by gateways.telegram[0].agent)" in r
                                for s, r in checks["agents"] if s == "fail"])


# ------------------------------------------------------------------ the control port while down


def test_a_free_control_port_is_ok_and_a_held_one_fails(capsys, root):
    port = free_port()
    text = (root / "config.toml").read_text()
    # init writes the first free port from 7820, which another home on the host may hold: set it whatever it is
    (root / "config.toml").write_text(re.sub(r'(?m)^listen = "127\.0\.0\.1:\d+"', f'listen = "127.0.0.1:{port}"',
                                             text, count=1))
    first = doctor(capsys, root)[1]["control port"]
    holder = socket.socket()
    holder.bind(("127.0.0.1", port))
    holder.listen()
    try:
        second = doctor(capsys, root)[1]["control port"]
    finally:
        holder.close()
    assert ("ok", "fail", True) == (first[0][0], second[0][0], "held by another program" in second[0][1])


# ------------------------------------------------------------------ --fix


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_fix_repairs_modes_folders_and_the_default_agent_and_says_so(capsys, root):
    set_secret(root / "data/secrets.json", "openai", "sk-test-value")
    os.chmod(root / "data/secrets.json", 0o644)
    os.chmod(root / "data/run", 0o755)
    os.chmod(root / "config.toml", 0o644)
    shutil.rmtree(root / "agents/default")
    shutil.rmtree(root / "data/logs")
    rc, checks, fixed = doctor(capsys, root, "--fix")
    said = "\n".join(fixed)
    assert (0, [], 0o600, 0o700, 0o640, True, True, True, True, True) == (
        rc, failures(checks), mode(root / "data/secrets.json"), mode(root / "data/run"),
        mode(root / "config.toml"), (root / "agents/default/config.toml").is_file(),
        f"chmod 0600 {root / 'data/secrets.json'} (was 0644)" in said, f"created folder {root / 'data/logs'}" in said,
        "created agent 'default'" in said, (root / "data/logs").is_dir())


def test_fix_on_a_sound_home_changes_nothing(capsys, root):
    _, _, fixed = doctor(capsys, root, "--fix")
    assert [] == fixed


def test_fix_tightens_an_agent_pack_open_to_others(capsys, root):
    os.chmod(root / "agents/default/MEMORY.md", 0o644)
    _, _, fixed = doctor(capsys, root, "--fix")
    assert ([f"chmod 0600 {root / 'agents/default/MEMORY.md'} (was 0644)"], 0o600) == (
        fixed, mode(root / "agents/default/MEMORY.md"))


def test_fix_prints_what_it_changed_for_people(capsys, root):
    os.chmod(root / "data/run", 0o755)
    main(["--home", str(root), "doctor", "--fix"])
    out = capsys.readouterr().out
    assert (True, True) == (f"fixed  chmod 0700 {root / 'data/run'} (was 0755)" in out, "1 fixed" in out)


# ------------------------------------------------------------------ services under a real supervisord


@pytest.fixture(scope="module")
def running():
    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    subprocess.run([sys.executable, "-m", "common.cli", "--home", str(root), "init"], cwd=REPO,
                   capture_output=True, timeout=60, check=True)
    home = make_home(LOCAL_PROVIDER.replace('listen = "127.0.0.1:7820"', f'listen = "127.0.0.1:{port}"')
                     .replace("processes = 2 ", "processes = 1 "), root=root)
    up = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(root), "up", "--timeout", "60"],
                        cwd=REPO, capture_output=True, text=True, timeout=90)
    assert 0 == up.returncode, up.stdout + up.stderr
    sup = Supervisor(home.paths)  # ready services may still be STARTING for supervisord's startsecs
    wanted = set(expected_services(home.cfg))
    wait_until(lambda: all(p.state == "RUNNING" for p in sup.processes() if p.name in wanted), timeout=20,
               what="every service RUNNING")
    try:
        yield home
    finally:
        subprocess.run([sys.executable, "-m", "common.cli", "--home", str(root), "down"], cwd=REPO,
                       capture_output=True, timeout=90)
        sup = Supervisor(home.paths)
        if sup.reachable():
            os.kill(sup.supervisord_pid(), signal.SIGKILL)
        remove_home(home)


def test_a_running_home_passes_with_every_service_and_the_control_port(capsys, running):
    rc, checks, _ = doctor(capsys, running.root)
    assert (0, [], "ok", True, "ok") == (
        rc, failures(checks), checks["services"][0][0],
        all(name in checks["services"][0][1] for name in ("writer", "runner-0", "scheduler", "sweeper", "control")),
        checks["control port"][0][0])


def test_a_stopped_scheduler_fails_while_the_daemon_is_up(capsys, running):
    sup = Supervisor(running.paths)
    sup.stop_process("scheduler")
    try:
        rc, checks, _ = doctor(capsys, running.root)
    finally:
        sup.start_process("scheduler")
    assert (1, [("services", True)]) == (rc, [(n, r.startswith("scheduler is STOPPED")) for n, r in failures(checks)])


def test_a_missing_key_of_a_provider_no_agent_uses_only_warns(capsys, root):
    set_secret(root / "data/secrets.json", "openai", "sk-test-value")
    with_config(root, '[providers.claude]\nkind = "anthropic"\napi_key = "anthropic"\nmodel = "claude-x"\n')
    rc, checks, _ = doctor(capsys, root)
    unused = [(s, "no agent uses providers.claude" in r) for s, r in checks["secrets"] if "'anthropic'" in r]
    pack_config = root / "agents/default/config.toml"
    pack_config.write_text(pack_config.read_text().replace('provider = "default"', 'provider = "claude"'))
    rc_used, checks_used, _ = doctor(capsys, root)
    assert (0, [("warn", True)], 1, True) == (rc, unused, rc_used, any(
        "'anthropic' (providers.claude.api_key) is not set" in r for s, r in checks_used["secrets"] if s == "fail"))
