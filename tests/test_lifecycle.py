"""Restart, start, stop and reload of a running home, each service kind, and a gateway instance in a
process of its own: `starling status` lists it, the platform's program no longer serves that instance,
and reload applies what can change in place (SIGHUP) and restarts what cannot, saying which."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from common.config import load_config
from common.home import paths_for
from common.supervisor import Supervisor
from tests.fake_telegram import FakeTelegramProcess
from tests.procs import REPO, wait_until

MAIN_TOKEN = "111111111:AAMainBotTokenForLifecycleTests_0123"
SIDE_TOKEN = "222222222:AASideBotTokenForLifecycleTests_0123"
GATEWAYS = """
[[gateways.telegram]]
id = "main"
token = "tg-main"
api_base = "{url}"

[[gateways.telegram]]
id = "side"
token = "tg-side"
api_base = "{url}"
process = "side"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Home:
    def __init__(self, root: Path, env: dict) -> None:
        self.root = root
        self.env = env
        self.config = root / "config.toml"

    @property
    def paths(self):
        return paths_for(self.root, load_config(self.config))

    def cli(self, *args: str, input: str | None = None, timeout: float = 90) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(self.root), *args], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout, input=input, env=self.env)

    def pids(self) -> dict[str, int]:
        return {p.name: p.pid for p in Supervisor(self.paths).processes()}

    def status(self) -> tuple[int, dict[str, dict]]:
        result = self.cli("status", "--json")
        return result.returncode, {s["service"]: s for s in json.loads(result.stdout)["services"]}

    def edit(self, old: str, new: str) -> None:
        text = self.config.read_text()
        assert old in text, old
        self.config.write_text(text.replace(old, new, 1))

    def log(self, service: str) -> str:
        path = self.paths.logs_dir / f"{service}.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    with FakeTelegramProcess(tmp_path_factory.mktemp("tg"), tokens=(MAIN_TOKEN, SIDE_TOKEN)) as tg:
        yield tg


@pytest.fixture(scope="module")
def home(fake, tmp_path_factory):
    root = Path(tempfile.mkdtemp(prefix="stl", dir="/tmp"))
    env = {k: v for k, v in os.environ.items() if k != "STARLING_HOME"}
    env.update(XDG_RUNTIME_DIR=str(tmp_path_factory.mktemp("runtime")))
    h = Home(root, env)
    assert 0 == h.cli("init").returncode
    h.edit('listen = "127.0.0.1:', f'listen = "127.0.0.1:{free_port()}"  # was 127.0.0.1:')
    h.edit("processes = 2 ", "processes = 1 ")
    h.edit("heartbeat_interval_ms = 60000", "heartbeat_interval_ms = 1000")
    with h.config.open("a") as f:
        f.write(GATEWAYS.format(url=fake.url))
    for name, token in (("tg-main", MAIN_TOKEN), ("tg-side", SIDE_TOKEN)):
        assert 0 == h.cli("secret", "set", name, "--value-stdin", input=token).returncode
    up = h.cli("up", "--timeout", "60")
    assert 0 == up.returncode, up.stdout + up.stderr
    try:
        yield h
    finally:
        h.cli("down")
        sup = Supervisor(h.paths)
        if sup.reachable():
            os.kill(sup.supervisord_pid(), signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def test_status_lists_every_gateway_process_and_each_serves_only_its_instances(home, fake):
    code, services = home.status()
    assert 0 == code
    gateways = {name: row for name, row in services.items() if name.startswith("gateway-")}
    assert ["gateway-telegram", "gateway-telegram-side"] == sorted(gateways)
    assert all(row["state"] in ("RUNNING", "STARTING") for row in gateways.values())
    assert "main:" in gateways["gateway-telegram"]["detail"] and "side" not in gateways["gateway-telegram"]["detail"]
    assert "side:" in gateways["gateway-telegram-side"]["detail"]
    assert "main" not in gateways["gateway-telegram-side"]["detail"]
    wait_until(lambda: fake.requests("getUpdates", bot=SIDE_TOKEN) and fake.requests("getUpdates", bot=MAIN_TOKEN),
               timeout=20, what="both bots polled")
    # one poller per bot: a second one would end the first with 409 Conflict, logged by the gateway
    time.sleep(1.0)
    assert "409" not in home.log("gateway-telegram") + home.log("gateway-telegram-side")


def test_the_process_name_alone_picks_the_instances_under_systemd(home):
    """systemd starts `--name gateway-telegram-side` (starling-gateway@telegram-side), no --process."""
    result = subprocess.run([sys.executable, "-m", "services.gateway.telegram", "--home", str(home.root), "--name",
                             "gateway-telegram-nobody"], cwd=REPO, capture_output=True, text=True, timeout=30,
                            env=home.env)
    assert (0, True) == (result.returncode, '"process":"nobody"' in result.stdout), result.stdout
    assert "nothing_configured" in result.stdout


def test_gateway_help_shows_instance_and_process(home):
    for platform in ("telegram", "slack", "whatsapp"):
        result = subprocess.run([sys.executable, "-m", f"services.gateway.{platform}", "--help"], cwd=REPO,
                                capture_output=True, text=True, timeout=30)
        assert (0, True, True) == (result.returncode, "--instance ID" in result.stdout, "--process NAME" in result.stdout)


@pytest.mark.parametrize("service", ["writer", "runner-0", "scheduler", "sweeper", "control", "gateway-telegram-side"])
def test_restart_one_service_of_each_kind(home, service):
    before = home.pids()
    started = time.monotonic()
    result = home.cli("restart", service)
    elapsed = time.monotonic() - started
    after = home.pids()
    assert (0, f"ready: {service}") == (result.returncode, result.stdout.strip().splitlines()[-1]), result.stdout + result.stderr
    assert after[service] != before[service]
    assert {n: p for n, p in before.items() if n != service} == {n: p for n, p in after.items() if n != service}
    assert elapsed < 15
    code, services = home.status()
    assert (0, True) == (code, services[service]["pid"] == after[service])


def test_a_kind_names_every_service_of_it(home):
    before = home.pids()
    result = home.cli("restart", "gateway")
    after = home.pids()
    assert 0 == result.returncode, result.stdout + result.stderr
    assert [n for n in before if before[n] != after[n]] == ["gateway-telegram", "gateway-telegram-side"]


def test_stop_makes_status_exit_3_and_start_brings_it_back(home):
    assert (0, "stopped: scheduler") == (home.cli("stop", "scheduler").returncode,
                                         home.cli("stop", "scheduler").stdout.strip().replace(
                                             "scheduler: not running (STOPPED)", "stopped: scheduler"))
    code, services = home.status()
    assert (3, "STOPPED") == (code, services["scheduler"]["state"])
    start = home.cli("start", "scheduler")
    assert (0, "ready: scheduler") == (start.returncode, start.stdout.strip().splitlines()[-1]), start.stderr
    assert 0 == home.status()[0]


def test_an_unknown_service_is_a_usage_error_listing_the_names(home):
    result = home.cli("restart", "runner:runner-0")
    assert (2, True) == (result.returncode, "services: writer, runner-0," in result.stderr), result.stderr


def test_reload_applies_in_place_what_it_can_and_restarts_the_rest(home, fake):
    fake.message("before the reload", user=4242, bot=MAIN_TOKEN)
    wait_until(lambda: '"event":"inbound_stranger"' in home.log("gateway-telegram"), timeout=20,
               what="the stranger's message")
    before = home.pids()
    home.edit("session_days = 30", "session_days = 9")  # sweeper, in place
    home.edit("wal_warn_threshold_mb = 100", "wal_warn_threshold_mb = 50")  # sweeper and control, in place
    home.edit('id = "main"\n', 'id = "main"\nallow = [4242]\n')  # gateway-telegram, in place
    home.edit("poll_interval_s = 30.0", "poll_interval_s = 20.0")  # the scheduler restarts
    home.edit("batch_max = 512", "batch_max = 256")  # the writer restarts
    home.edit("processes = 1 ", "processes = 2 ")  # runner-1 is added
    up = home.cli("up")
    assert (0, True) == (up.returncode, "run `starling reload`" in up.stdout), up.stdout
    assert "retention.session_days" in up.stdout
    result = home.cli("reload")
    assert 0 == result.returncode, result.stdout + result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "in place (SIGHUP): sweeper, control, gateway-telegram" in lines, result.stdout
    assert "restarted: writer, scheduler" in lines, result.stdout
    assert "added: runner-1" in lines, result.stdout
    after = home.pids()
    same = ["runner-0", "sweeper", "control", "gateway-telegram", "gateway-telegram-side"]
    assert {n: before[n] for n in same} == {n: after[n] for n in same}
    assert all(after[n] != before[n] for n in ("writer", "scheduler")) and "runner-1" in after
    for service in ("sweeper", "control", "gateway-telegram"):
        wait_until(lambda: '"event":"config_reloaded"' in home.log(service), timeout=10, what=f"{service} reloaded")
    fake.message("after the reload", user=4242, bot=MAIN_TOKEN)  # allowed now, by the same process
    wait_until(lambda: '"event":"inbound",' in home.log("gateway-telegram"), timeout=20,
               what=f"the message taken as a turn:\n{home.log('gateway-telegram')[-3000:]}")
    again = home.cli("reload")
    assert (0, "config.toml is what the services run with: nothing to do.") == (again.returncode, again.stdout.strip())
    code, services = home.status()
    assert (0, True) == (code, services["runner-1"]["heartbeat"] in ("ready", "idle"))


def test_reload_refuses_a_config_that_does_not_load_and_changes_nothing(home):
    before = home.pids()
    text = home.config.read_text()
    home.config.write_text(text.replace("session_days = 9", 'session_days = "nine"'))
    try:
        result = home.cli("reload")
    finally:
        home.config.write_text(text)
    assert (1, True) == (result.returncode, "retention.session_days" in result.stderr), result.stderr
    assert before == home.pids()


def test_reload_refuses_a_moved_data_dir(home):
    before = home.pids()
    text = home.config.read_text()
    home.config.write_text(text.replace('data_dir = "data"', 'data_dir = "elsewhere"'))
    try:
        result = home.cli("reload")
    finally:
        home.config.write_text(text)
    assert (1, True) == (result.returncode, "data_dir changed: the services run with" in result.stderr), result.stderr
    assert before == home.pids()
    assert not (home.root / "elsewhere").exists()


def test_a_gateway_instance_moved_into_its_own_process_by_reload(home, fake):
    home.edit('id = "main"\n', 'id = "main"\nprocess = "first"\n')
    result = home.cli("reload")
    assert 0 == result.returncode, result.stdout + result.stderr
    assert "added: gateway-telegram-first" in result.stdout and "removed: gateway-telegram" in result.stdout
    code, services = home.status()
    assert 0 == code
    assert ["gateway-telegram-first", "gateway-telegram-side"] == sorted(n for n in services if n.startswith("gateway"))


def test_restart_everything(home):
    before = home.pids()
    started = time.monotonic()
    result = home.cli("restart")
    elapsed = time.monotonic() - started
    after = home.pids()
    assert 0 == result.returncode, result.stdout + result.stderr
    assert [] == [n for n in before if after.get(n) == before[n]]
    assert elapsed < 30
    assert 0 == home.status()[0]
