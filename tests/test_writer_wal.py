"""Readers read while the writer writes (WAL), and checkpoints keep the WAL bounded while they poll."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

from common import db
from common.stores import turn_store
from schema import messages as m
from tests.procs import REPO, make_home, remove_home, start_writer

WAL_BOUND_MB = 1


def test_a_polling_reader_sees_writes_and_the_wal_stays_bounded():
    home = make_home(f"[writer]\nwal_truncate_mb = {WAL_BOUND_MB}\ncheckpoint_interval_s = 0.2\n")
    writer = start_writer(home)
    out = home.root / "reader.json"
    reader = subprocess.Popen([sys.executable, "-m", "tests.reader", str(home.paths.db_file), "4", str(out)], cwd=REPO)
    wal = home.paths.db_file.with_name("starling.db-wal")
    wal_sizes: list[int] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            wal_sizes.append(wal.stat().st_size if wal.exists() else 0)
            time.sleep(0.01)

    sampler = threading.Thread(target=sample)
    sampler.start()
    body = "x" * 2000

    async def stream() -> int:
        async with home.client("wal") as c:
            written = 0
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                await asyncio.gather(*(c.call(m.Inbound(
                    agent="default", instance="test", chat=f"wal-{i}", sender="u", text=f"{written + i} {body}",
                    dedupe_keys=[f"wal:{written + i}"])) for i in range(64)))
                written += 64
            return written

    try:
        written = asyncio.run(stream())
        assert 0 == reader.wait(30)
        stop.set()
        sampler.join(5)
        seen = json.loads(out.read_text())
        conn = db.open_reader(home.paths.db_file)
        stored = turn_store.count(conn)
        conn.close()
        written_mb = written * len(body) / 2**20
        # without checkpoints the WAL would hold every page written (well over 10 MB here)
        assert (True, stored, 0, []) == (written_mb > 10, written, seen["went_back"], seen["errors"])
        assert seen["reads"] > 100 and seen["max_count"] > 0
        assert max(wal_sizes) < 4 * WAL_BOUND_MB * 2**20, f"WAL peaked at {max(wal_sizes)} bytes"
    finally:
        stop.set()
        if reader.poll() is None:
            reader.kill()
            reader.wait(10)
        writer.stop()
        remove_home(home)
