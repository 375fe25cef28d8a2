"""Several homes on one host: init picks a free control port, two homes run at once, `up` refuses a port
another program holds before anything starts, naming it and its holder, and a command run where there is
no home says so and lists the homes running here (their run files)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from common import ports
from common.config import load_config
from common.supervisor import Supervisor
from tests.procs import REPO


def cli(home: Path | None, *args: str, cwd: Path = REPO, env: dict | None = None,
        timeout: float = 90) -> subprocess.CompletedProcess:
    home_args = ["--home", str(home)] if home else []
    return subprocess.run([sys.executable, "-m", "common.cli", *home_args, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """An environment of its own for the run files (XDG_RUNTIME_DIR), and two fresh homes under /tmp."""
    runtime = tmp_path_factory.mktemp("runtime")
    env = {k: v for k, v in os.environ.items() if k != "STARLING_HOME"}
    env.update(XDG_RUNTIME_DIR=str(runtime), PYTHONPATH=str(REPO))
    roots = [Path(tempfile.mkdtemp(prefix="sth", dir="/tmp")) for _ in range(2)]
    homes = [root / "home" for root in roots]
    yield env, homes
    for home in homes:
        if (home / "config.toml").exists():
            cli(home, "down", env=env)
            sup = Supervisor(_paths(home))
            if sup.reachable():  # `down` failed: leave no process behind
                os.kill(sup.supervisord_pid(), 9)
    for root in roots:
        shutil.rmtree(root, ignore_errors=True)


def _paths(home: Path):
    from common.home import paths_for
    return paths_for(home, load_config(home / "config.toml"))


def _one_runner(home: Path) -> None:
    config = home / "config.toml"
    config.write_text(config.read_text().replace("processes = 2 ", "processes = 1 ", 1))


def _port(home: Path) -> int:
    return int(load_config(home / "config.toml").control.listen.rpartition(":")[2])


def test_two_homes_get_their_own_ports_and_run_at_once(host):
    env, (first, second) = host
    assert 0 == cli(first, "init", env=env).returncode
    _one_runner(first)
    up = cli(first, "up", env=env)
    assert 0 == up.returncode, up.stdout + up.stderr
    init = cli(second, "init", env=env)  # the first one's port is taken now: the next free one
    assert (0, True) == (init.returncode, f"control on 127.0.0.1:{_port(second)}" in init.stdout), init.stdout
    assert _port(first) != _port(second)
    _one_runner(second)
    up = cli(second, "up", env=env)
    assert 0 == up.returncode, up.stdout + up.stderr
    for home in (first, second):
        status = cli(home, "status", env=env)
        assert (0, f"Starling home {home}") == (status.returncode, status.stdout.splitlines()[0].split(":")[0])


def test_a_command_where_there_is_no_home_says_so_and_lists_the_running_homes(host, tmp_path):
    env, (first, second) = host
    started = time.monotonic()
    result = cli(None, "status", cwd=tmp_path, env=env)
    assert (1, "") == (result.returncode, result.stdout)
    assert "no Starling home at ./.starling: use --home or STARLING_HOME" in result.stderr
    listed = [line.split()[0] for line in result.stderr.splitlines() if line.startswith("  /")]
    assert [str(first), str(second)] == listed
    assert time.monotonic() - started < 10
    assert not (tmp_path / ".starling").exists()  # nothing made, unlike `init`


def test_up_refuses_a_port_held_by_another_program_before_starting_anything(host):
    env, (_, second) = host
    assert 0 == cli(second, "down", env=env).returncode
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # a port of its own: the home's may be taken by another test's home now
    holder.listen()
    port = holder.getsockname()[1]
    config = second / "config.toml"
    config.write_text(re.sub(r'(?m)^listen = "127\.0\.0\.1:\d+"', f'listen = "127.0.0.1:{port}"',
                             config.read_text(), count=1))
    try:
        started = time.monotonic()
        up = cli(second, "up", env=env)
        elapsed = time.monotonic() - started
    finally:
        holder.close()
    assert (1, True) == (up.returncode, elapsed < 5), up.stdout + up.stderr
    assert f"port {port} ([control] listen = '127.0.0.1:{port}') is in use by pid {os.getpid()}" in up.stderr
    assert "Traceback" not in up.stderr
    assert not Supervisor(_paths(second)).reachable()  # nothing was started
    assert not (_paths(second).run_dir / "supervisor.sock").exists()
    listed = cli(None, "status", cwd=second.parent, env=env).stderr
    assert str(second) not in listed  # its run file went with `down`


def test_the_holder_of_a_starling_port_is_named_as_that_homes_service(host):
    env, (first, _) = host
    assert f"Starling's control of the home {first}" in ports.holder(_port(first))


def test_commands_that_need_the_writer_fail_at_once_when_starling_is_not_running(host):
    env, (_, second) = host  # stopped by the test above
    for args in (["cron", "add", "x", "--schedule", "@daily", "--prompt", "hi", "--deliver-to", "cli:me"],
                 ["pairing", "approve", "ABCDEFGH"], ["fts", "rebuild"]):
        started = time.monotonic()
        result = cli(second, *args, env=env)
        elapsed = time.monotonic() - started
        assert (1, True) == (result.returncode, elapsed < 2 + 1.5), (args, elapsed)  # + the interpreter's start
        assert "Starling is not running (start it with `starling up`)" in result.stderr, result.stderr


def test_lifecycle_verbs_say_starling_is_not_running(host):
    env, (_, second) = host
    for verb in (["restart"], ["reload"], ["stop", "writer"], ["start", "writer"]):
        result = cli(second, *verb, env=env)
        assert (1, True) == (result.returncode, "Starling is not running" in result.stderr), result.stderr


def test_a_file_as_home_is_one_line_not_a_traceback(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    for args in (["init"], ["status"], ["secret", "list"]):
        result = cli(afile, *args)
        assert (1, "is a file") == (result.returncode, "is a file" if "is a file" in result.stderr
                                    else result.stderr), args
        assert "Traceback" not in result.stderr
    inside = cli(afile / "below", "init")
    assert (1, False) == (inside.returncode, "Traceback" in inside.stderr), inside.stderr


def test_webhook_servers_of_two_processes_on_one_address_are_refused():
    from common.config import Config, Gateways, Telegram

    cfg = Config(gateways=Gateways(telegram=[
        Telegram(id="a", mode="webhook", public_url="https://x/a", listen="127.0.0.1:7930"),
        Telegram(id="b", mode="webhook", public_url="https://x/b", listen="127.0.0.1:7930", process="b"),
        Telegram(id="c", mode="webhook", public_url="https://x/c", listen="127.0.0.1:7930"),  # same process as a
    ]))
    problems = ports.clashes(cfg)
    assert 1 == len(problems) and "gateway-telegram-b" in problems[0] and "7930" in problems[0], problems
