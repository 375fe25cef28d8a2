"""Warnings and errors into the daemon_log table: kept by the log (common/log.py), sent to a real writer in
batches (common/daemon_log.py), bounded by retention and a row cap, and shown by `starling logs --db`."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import time

import pytest
import structlog

from common import daemon_log, db
from common import log as logging
from common.redact import register_secret
from common.stores import dashboard_store
from schema import messages as m
from tests.procs import REPO, make_home, remove_home, start_writer

SECRET = "sk-daemon-log-secret-0042xy"


@pytest.fixture(scope="module")
def home():
    h = make_home()
    writer = start_writer(h)
    yield h
    writer.stop()
    remove_home(h)


def rows(home) -> list[dashboard_store.LogRow]:
    conn = db.open_reader(home.paths.db_file)
    try:
        with db.read_tx(conn):
            return dashboard_store.log_lines(conn, 0, ("warning", "error", "critical"), "", 1000)
    finally:
        conn.close()


def test_only_warnings_and_errors_are_kept_and_redacted():
    queue = logging.keep_warnings()
    queue.clear()
    log = logging.setup_logging("tester", stream=io.StringIO())
    register_secret(SECRET)
    log.info("fine", n=1)
    log.warning("disk_low", free_mb=12, token=SECRET)
    log.error("boom", error=f"failed with {SECRET}")
    lines = daemon_log.batch(queue, "tester")
    assert [("tester", "warning", "disk_low"), ("tester", "error", "boom")] == [
        (line.service, line.level, line.event) for line in lines]
    assert 12 == json.loads(lines[0].detail)["free_mb"] and all(SECRET not in line.detail for line in lines)
    assert abs(lines[0].at - time.time()) < 60


def test_lines_reach_the_table_in_batches_and_logs_db_shows_them(home):
    queue = logging.keep_warnings()
    queue.clear()
    structlog.get_logger().warning("shipped_warning", turn_id=4242)

    async def go():
        async with home.client("tester") as client:
            task = asyncio.create_task(daemon_log.ship(client, "tester", lambda: 30, structlog.get_logger(),
                                                       interval_s=0.1))
            deadline = time.monotonic() + 10
            while not any(r.event == "shipped_warning" for r in rows(home)) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            task.cancel()

    asyncio.run(go())
    found = [r for r in rows(home) if r.event == "shipped_warning"]
    assert len(found) == 1 and json.loads(found[0].detail)["turn_id"] == 4242
    shown = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home.root), "logs", "--db"],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert 0 == shown.returncode and "shipped_warning" in shown.stdout and "turn_id=4242" in shown.stdout


def test_retention_and_the_row_cap_bound_the_table(home):
    now = time.time()
    old = [m.DaemonLogLine(at=now - 40 * 86400, service="old", level="warning", event="ancient")]
    many = [m.DaemonLogLine(at=now, service="many", level="error", event=f"e{i}") for i in range(30)]

    async def go():
        async with home.client("tester") as client:
            await client.call(m.RecordDaemonLog(lines=old))
            await client.call(m.RecordDaemonLog(lines=many, before=now - 30 * 86400, max_rows=20))

    asyncio.run(go())
    left = rows(home)
    assert not any(r.event == "ancient" for r in left) and len(left) == 20
    assert {f"e{i}" for i in range(10, 30)} == {r.event for r in left}
