"""Operating a home under supervisord: up, status, restarts after kill -9, health, the control API, down."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import zmq

from common.pids import alive
from common.supervisor import Supervisor
from tests.procs import REPO, ctrl_c_works, make_home, remove_home, wait_until

SERVICES = ["writer", "runner-0", "runner-1", "scheduler", "sweeper", "control"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def starling(home, *args: str, timeout: float = 60, input: str | None = None,
             env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home.root), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, input=input,
                          env={**os.environ, **(env or {})})


def get(url: str, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


@pytest.fixture(scope="module")
def running():
    port = free_port()
    root = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    init = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(root), "init"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert 0 == init.returncode, init.stderr
    home = make_home(  # the fresh home, with a free port and quick heartbeats for the test
        f'[control]\nlisten = "127.0.0.1:{port}"\n'
        "[health]\nheartbeat_interval_ms = 1000\nwal_warn_threshold_mb = 2\n"
        "[writer]\ncheckpoint_interval_s = 3600\nwal_truncate_mb = 512\n",
        root=root,
    )
    up = starling(home, "up", "--timeout", "60", env={"STARLING_LOG_MAXBYTES": "4KB"})  # rotate often
    home.base_url = f"http://127.0.0.1:{port}"
    home.up = up
    try:
        yield home
    finally:
        starling(home, "down")
        sup = Supervisor(home.paths)
        if sup.reachable():  # the down test failed: do not leave processes behind
            pid = sup.supervisord_pid()
            os.kill(pid, signal.SIGKILL)
        remove_home(home)


def test_up_reports_every_service_ready(running):
    assert (0, True) == (running.up.returncode, all(name in running.up.stdout for name in SERVICES)), running.up


def test_status_lists_each_process_running_with_a_heartbeat(running):
    result = starling(running, "status", "--json")
    services = {s["service"]: s for s in json.loads(result.stdout)["services"]}
    # supervisord says STARTING until startsecs (1 s) pass; readiness is the heartbeat of that pid
    assert {n: True for n in SERVICES} == {n: services[n]["state"] in ("STARTING", "RUNNING") for n in SERVICES}
    assert all(services[n]["pid"] and services[n]["heartbeat"] in ("ready", "idle") for n in SERVICES)
    assert [] == [name for name in services if name.startswith("gateway-")]  # none configured, none run


def test_a_second_up_says_so_and_changes_nothing(running):
    before = {p.name: p.pid for p in Supervisor(running.paths).processes()}
    result = starling(running, "up")
    after = {p.name: p.pid for p in Supervisor(running.paths).processes()}
    assert (0, True, before) == (result.returncode, "already running" in result.stdout, after)


def test_logs_follow_keeps_reading_across_supervisord_rotations(running):
    out = running.root / "follow.txt"
    peer = zmq.Context.instance().socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.setsockopt(zmq.SNDHWM, 0)
    peer.connect(running.endpoints.writer)

    def followed() -> str:
        return out.read_text()

    with open(out, "w") as sink:
        follower = subprocess.Popen([sys.executable, "-m", "common.cli", "--home", str(running.root), "logs",
                                     "writer", "-f", "-n", "0"], cwd=REPO, stdout=sink, stderr=subprocess.STDOUT,
                                        preexec_fn=ctrl_c_works)
        try:
            # an unsigned frame makes the writer log a drop: repeat until the follower shows one
            def reading() -> bool:
                peer.send_multipart([b"0" * 16, b"marker"])
                return "frame_dropped" in followed()

            wait_until(reading, timeout=20, interval=0.3, what="the follower to show a first line")
            for _ in range(4000):  # the writer logs a drop at counts 1..10, then every 100th
                peer.send_multipart([b"0" * 16, b"garbage"])
            wait_until(lambda: followed().count("frame_dropped") >= 45, timeout=30,
                       what=f"the flood to be followed, got:\n{followed()[-1500:]}")
        finally:
            peer.close()
            follower.send_signal(signal.SIGINT)
            code = follower.wait(10)
    counts = [int(c) for c in re.findall(r"count=(\d+)", followed())]
    hundreds = [c for c in counts if c % 100 == 0]
    rotated = (running.paths.logs_dir / "writer.log.1").exists()
    assert (0, True, True) == (code, rotated, len(hundreds) >= 38)
    assert list(range(hundreds[0], hundreds[0] + 100 * len(hundreds), 100)) == hundreds  # no line lost


@pytest.mark.parametrize("service", SERVICES)
def test_a_killed_service_is_restarted_and_reports_again(running, service):
    sup = Supervisor(running.paths)
    old = next(p.pid for p in sup.processes() if p.name == service)
    os.kill(old, signal.SIGKILL)

    def back() -> bool:
        info = next(p for p in sup.processes() if p.name == service)
        if info.state != "RUNNING" or info.pid == old:
            return False
        status = json.loads(starling(running, "status", "--json").stdout)
        row = next(s for s in status["services"] if s["service"] == service)
        return row["pid"] == info.pid and row["heartbeat"] in ("ready", "idle") and row["restarts"] >= 1

    wait_until(back, timeout=30, interval=0.2, what=f"{service} to come back")


def test_livez_and_health_need_no_token_and_health_shows_detail_only_with_it(running):
    assert (200, "alive") == (get(running.base_url + "/livez")[0], get(running.base_url + "/livez")[1]["status"])
    code, report = get(running.base_url + "/health")
    assert 200 == code and report["status"] in ("ok", "degraded")
    # without the token: each check's status and nothing else (no pids, names, paths or addresses)
    assert {"services", "wal", "disk"} <= set(report["checks"])
    assert all({"status"} == set(check) for check in report["checks"].values()), report
    token = running.paths.control_token_file.read_text().strip()
    code, full = get(running.base_url + "/health", token=token)
    writer = full["checks"]["services"]["services"]["writer"]
    assert (200, True) == (code, isinstance(writer["pid"], int) and "folders" in full["checks"]["disk"])
    wrong = get(running.base_url + "/health", token="x" + token)[1]
    assert all({"status"} == set(check) for check in wrong["checks"].values()), wrong


def test_the_control_api_refuses_a_missing_or_wrong_token(running):
    token = running.paths.control_token_file.read_text().strip()
    assert (401, {"error": "unauthorized"}) == get(running.base_url + "/api/status")
    assert (401, {"error": "unauthorized"}) == get(running.base_url + "/api/status", token="x" + token)
    code, body = get(running.base_url + "/api/status", token=token)
    assert (200, True) == (code, {"writer", "control"} <= {b["service"] for b in body["beats"]})


def test_health_turns_degraded_when_the_wal_is_held_past_its_threshold_and_alerts_once_per_change(running):
    import asyncio

    from common import db
    from common.stores import beat_store
    from schema import messages as m

    async def fill(round_: int):
        async with running.client("wal-filler") as c:
            await asyncio.gather(*(c.call(m.Inbound(agent="default", instance="test", chat="wal", sender="u",
                                                    text="w" * 2000, dedupe_keys=[f"wal:{round_}:{i}"]))
                                   for i in range(1500)))

    async def truncate():
        async with running.client("wal-truncate") as c:
            await c.call(m.Checkpoint(mode="truncate"))

    asyncio.run(truncate())  # heartbeats of earlier tests grew the WAL: start from empty and healthy
    wait_until(lambda: get(running.base_url + "/health")[1]["status"] == "ok", timeout=20, what="health ok")
    control_log = running.paths.logs_dir / "control.log"
    start = control_log.stat().st_size

    def alerts() -> int:
        with open(control_log) as f:
            f.seek(start)
            return f.read().count('"event":"health_degraded"')

    for round_ in (1, 2):
        # the sweeper TRUNCATEs the WAL every beat; a reader holding old frames keeps it large
        reader = db.open_reader(running.paths.db_file)
        try:
            with db.read_tx(reader) as conn:
                beat_store.all_beats(conn)  # the snapshot starts at the first read
                asyncio.run(fill(round_))
                wait_until(lambda: get(running.base_url + "/health")[1]["status"] == "degraded", timeout=20,
                           what="health to turn degraded")
                code, report = get(running.base_url + "/health")
                assert (200, "degraded") == (code, report["checks"]["wal"]["status"])
                # control holds alerts for 3 beats after its own start (it was killed and restarted above)
                wait_until(lambda: alerts() >= round_, timeout=20, what="the degraded alert")
                time.sleep(2.5)  # more health rounds while degraded: still one alert for this change
                assert round_ == alerts()
        finally:
            reader.close()
        # released: the sweeper's next TRUNCATE gives the WAL back and health recovers
        wait_until(lambda: get(running.base_url + "/health")[1]["status"] == "ok", timeout=20, what="recovery")


def test_down_stops_everything_and_leaves_no_process(running):
    pids = [p.pid for p in Supervisor(running.paths).processes() if p.pid]
    daemon = Supervisor(running.paths).supervisord_pid()
    result = starling(running, "down")
    left = [pid for pid in [daemon, *pids] if alive(pid)]
    assert (0, []) == (result.returncode, left), result.stdout + result.stderr
