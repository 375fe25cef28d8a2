"""The WAL watch end to end: a real writer, sweeper and control. The sweeper keeps the WAL truncated; a reader
holding old frames keeps it large, health turns degraded, and control alerts once for the change (a warning
log line and a message to ``[health] alert_to``), not on every beat. (Two changes in a row, under
supervisord: tests/test_operate.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
import urllib.error
import urllib.request

from common import db, health
from common.db import read_tx
from common.stores import beat_store, outbox_store
from schema import messages as m
from tests.procs import Proc, wait_until
from tests.sweeper_helpers import running, start_sweeper, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port: int) -> str:
    return f"""\
[control]
listen = "127.0.0.1:{port}"
[health]
heartbeat_interval_ms = 500
wal_warn_threshold_mb = 1
disk_warn_threshold_mb = 1
alert_to = "ops:42"
[writer]
checkpoint_interval_s = 3600
wal_truncate_mb = 512
[[gateways.telegram]]
id = "ops"
"""


def get_health(port: int, home=None) -> dict:
    """/health: the status of each check, and with ``home`` (its control token) the whole report."""
    token = home.paths.control_token_file.read_text().strip() if home is not None else ""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/health",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())
    except urllib.error.URLError:  # control is not listening yet
        return {"status": "unreachable"}


async def fill(home, prefix: str, count: int) -> None:
    async with home.client("filler") as client:
        await asyncio.gather(*(client.call(m.Inbound(agent="default", instance="tg", chat=prefix, sender="u",
                                                     text=f"{prefix} {i} " + "w" * 1000,
                                                     dedupe_keys=[f"{prefix}:{i}"]))
                               for i in range(count)))


@contextlib.contextmanager
def old_frames_held(home):
    """A reader holding a snapshot: the WAL frames written after it cannot be checkpointed back."""
    reader = db.open_reader(home.paths.db_file)
    try:
        with read_tx(reader) as conn:
            beat_store.all_beats(conn)  # the snapshot starts at the first read
            yield
    finally:
        reader.close()


def test_the_sweeper_truncates_the_wal_and_a_held_wal_alerts_once(monkeypatch):
    port = free_port()
    with running(config(port)) as (home, procs):
        sweeper = start_sweeper(home, monkeypatch)
        procs.append(sweeper)
        control = Proc(home, "control")
        procs.append(control)
        wait_for(sweeper, "health_checked")
        wait_until(lambda: get_health(port)["status"] == "ok", timeout=20, what="health ok")
        wal = lambda: health.wal_bytes(home.paths.db_file)  # noqa: E731

        # under the threshold, yet the WAL grew (~0.5 MB); only the sweeper's TRUNCATE gives it back here
        # (a fill takes ~50 ms: when a tick truncated in the middle of one, fill again)
        for attempt in range(5):
            asyncio.run(fill(home, f"small{attempt}", 150))
            grown = wal()
            if grown > 200 * 1024:
                break
        assert 200 * 1024 < grown < 2**20
        wait_until(lambda: wal() < 64 * 1024, timeout=10, what=f"the sweeper to truncate the WAL (was {grown})")

        def alerts() -> tuple[list[dict], list[str]]:
            lines = [json.loads(line) for line in control.log_text().splitlines() if '"event":"health_' in line]
            reader = db.open_reader(home.paths.db_file)
            try:
                with read_tx(reader) as conn:
                    bodies = [row.body for row in outbox_store.for_chat(conn, "ops", "42")]
            finally:
                reader.close()
            return lines, bodies

        def wal_alerts() -> int:
            return sum(1 for e in alerts()[0] if e["event"] == "health_degraded" and any("WAL" in p for p in e["problems"]))

        with old_frames_held(home):
            asyncio.run(fill(home, "big", 1500))
            wait_until(lambda: wal_alerts() == 1, timeout=20, what="the alert")
            report = get_health(port)
            assert ("degraded", "degraded") == (report["status"], report["checks"]["wal"]["status"])
            # the sweeper could not truncate and says so in its beat, which /health shows
            wait_until(lambda: "reader holds" in get_health(port, home)["checks"]["services"]["services"]["sweeper"]
                       ["detail"], timeout=10, what="the sweeper's detail")
            time.sleep(2.0)  # four more health rounds while degraded: no new alert
            assert 1 == len(alerts()[0])
        # the reader is gone: the sweeper's next TRUNCATE gives the WAL back and health recovers
        wait_until(lambda: len(alerts()[0]) == 2, timeout=20, what="recovery")
        # control logs the change, then queues its message through the writer: wait for both
        wait_until(lambda: len(alerts()[1]) == 2, timeout=10, what="the recovery message queued")

        events, bodies = alerts()
        assert (["health_degraded", "health_recovered"], "warning") == ([e["event"] for e in events],
                                                                        events[0]["level"])
        assert ([True, False], [False, True]) == (
            [b.startswith("Starling health is degraded") and "WAL is" in b for b in bodies],
            [b.startswith("Starling recovered") for b in bodies])
        assert wal() < 64 * 1024
