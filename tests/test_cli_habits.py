"""CLI habits: `secret list`, --home after the verb, --version, a closed pipe, a secret typed at a terminal
(no echo), `logs` over every service with --since and --level, a README that stands alone, and the
reload plan (which keys change in place, which restart what)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from common import reload_plan
from common.config import Config, Gateways, Retention, Runner, Scheduler, Telegram, default_config_text
from common.secrets import list_secrets
from tests.procs import REPO

README = (REPO / "README.md").read_text()


def cli(*args: str, input: str | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, input=input, **kw)


def test_secret_list_and_home_after_the_verb(home):
    before = cli("--home", str(home.root), "secret", "--json")
    after = cli("secret", "list", "--json", "--home", str(home.root))
    assert (0, 0) == (before.returncode, after.returncode), after.stderr
    assert json.loads(before.stdout) == json.loads(after.stdout)
    assert "openai" in {row["name"] for row in json.loads(after.stdout)}


def test_version():
    result = cli("--version")
    assert (0, True) == (result.returncode, bool(re.fullmatch(r"starling \S+\n", result.stdout))), result.stdout


def test_a_closed_pipe_ends_the_command_quietly(home):
    secrets = {f"name-{i:05d}": "v" * 12 for i in range(4000)}  # far more than a pipe buffer of output
    home.paths.secrets_file.write_text(json.dumps(secrets))
    proc = subprocess.Popen([sys.executable, "-m", "common.cli", "--home", str(home.root), "secret", "list"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    stderr = proc.stderr.read().decode()
    assert (0, "") == (proc.wait(30), stderr)


def test_a_secret_typed_at_a_terminal_is_not_echoed(home):
    value = "typed-secret-value-4821"
    pid, fd = pty.fork()  # the child gets the pty as its controlling terminal, as a person's shell would
    if pid == 0:
        os.chdir(REPO)
        os.execv(sys.executable, [sys.executable, "-m", "common.cli", "--home", str(home.root), "secret", "set",
                                  "typed", "--value-stdin"])
    seen = b""
    deadline = time.monotonic() + 30
    sent = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        if not sent and b"not shown" in seen:
            os.write(fd, value.encode() + b"\r")
            sent = True
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert (0, True) == (os.waitstatus_to_exitcode(status), sent), seen
    assert value.encode() not in seen
    stored = {s.name: s.source for s in list_secrets(home.paths.secrets_file, {})}
    assert "file" == stored.get("typed")
    assert value == json.loads(home.paths.secrets_file.read_text())["typed"]


def _line(ts: datetime, level: str, service: str, event: str) -> str:
    stamp = ts.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({"ts": stamp, "level": level, "service": service, "event": event}, separators=(",", ":"))


def test_logs_without_a_service_merge_every_log_and_filter_by_time_and_level(home):
    now = datetime.now(timezone.utc)
    logs = home.paths.logs_dir
    (logs / "writer.log.1").write_text(_line(now - timedelta(hours=3), "error", "writer", "old_rotated") + "\n"
                                       + _line(now - timedelta(minutes=50), "warning", "writer", "rotated_warn") + "\n")
    (logs / "writer.log").write_text(_line(now - timedelta(minutes=5), "info", "writer", "w_info") + "\n"
                                     + _line(now - timedelta(minutes=2), "error", "writer", "w_error") + "\n")
    (logs / "runner-0.log").write_text(_line(now - timedelta(minutes=30), "warning", "runner-0", "r_warn") + "\n"
                                       + _line(now - timedelta(minutes=1), "debug", "runner-0", "r_debug") + "\n")
    (logs / "supervisord.log").write_text("2026-01-01 00:00:00,000 INFO supervisord started\n")

    def events(*args: str) -> list[str]:
        result = cli("--home", str(home.root), "logs", "--json", *args)
        assert 0 == result.returncode, result.stderr
        return [json.loads(line)["event"] for line in result.stdout.splitlines()]

    assert ["r_warn", "w_info", "w_error", "r_debug"] == events()  # merged by time, supervisord's left out
    assert ["rotated_warn", "r_warn", "w_error"] == events("--since", "1h", "--level", "warn")
    assert ["w_error"] == events("--level", "error", "-n", "1")
    assert ["old_rotated", "w_error"] == events("writer", "--level", "error", "--since", "1d")
    assert ["r_debug"] == events("--since", (now - timedelta(seconds=90)).astimezone().strftime("%Y-%m-%dT%H:%M:%S"))
    bad = cli("--home", str(home.root), "logs", "--since", "yesterday")
    assert (2, True) == (bad.returncode, "expected 30s, 10m, 2h, 1d" in bad.stderr)


def test_the_readme_stands_alone():
    links = re.findall(r"\]\(([^)]+)\)", README)
    outside = [link for link in links if link.startswith(("../", "/")) or "shared/DESIGN" in link]
    assert [] == outside
    missing = [link for link in links if "://" not in link and not link.startswith("#")
               and not (REPO / link.split("#")[0]).exists()]
    assert [] == missing


def test_the_default_config_promises_no_tcp_for_other_hosts():
    bus = default_config_text().split("[bus]", 1)[1]
    assert "for other hosts" not in bus.replace("other hosts: not built", "")


def _telegram(**kw) -> Telegram:
    return Telegram(**{"id": "main", **kw})


def test_reload_plan_in_place_restart_and_unknown_keys():
    old = Config(runner=Runner(processes=2), gateways=Gateways(telegram=[_telegram(), _telegram(id="side", process="s")]))
    new = Config(runner=Runner(processes=2), retention=Retention(session_days=9), scheduler=Scheduler(poll_interval_s=5),
                 gateways=Gateways(telegram=[_telegram(allow=["1"]), _telegram(id="side", process="s", groups="all")]))
    plan = reload_plan.plan(old, new)
    assert {"sweeper", "gateway-telegram"} == plan.in_place
    assert {"scheduler", "gateway-telegram-s"} == plan.restart
    bigger = reload_plan.plan(old, Config(runner=Runner(processes=3), gateways=old.gateways))
    assert (set(), set()) == (bigger.in_place, bigger.restart)  # runner-2 is supervisord's to add
    moved = reload_plan.plan(old, Config(data_dir="elsewhere", runner=old.runner, gateways=old.gateways))
    assert ["data_dir"] == moved.needs_down
    everything = reload_plan.plan(old, Config(agents_dir="other", runner=old.runner, gateways=old.gateways))
    assert {"writer", "runner-0", "runner-1", "scheduler", "sweeper", "control", "gateway-telegram",
            "gateway-telegram-s"} == everything.restart  # a key without a rule restarts every service
