"""Helpers of the sweeper's tests: history seeded with chosen times, a sweeper on a test clock, its log."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Callable, Iterator

import apsw

from common import db
from common.stores import db_store, schema_store
from tests.clocks import SWEEPER_ENV as CLOCK_ENV
from tests.procs import Home, Proc, make_home, remove_home, start_writer, wait_until

DAY = 86400.0
TZ = "Europe/Berlin"  # the sweeper's local time in these tests: not UTC, so local dates are really tested


def seed(home: Home, fill: Callable[[apsw.Connection, Home], None]) -> None:
    """Write history straight into the database before the writer starts (times a live writer cannot
    give: a month ago, 23:00 yesterday), the way an older install would have left it."""
    conn = db.open_writer(home.paths.db_file)
    try:
        schema_store.migrate(conn, home.paths.db_file)
        db_store.begin(conn)
        fill(conn, home)
        db_store.commit(conn)
    finally:
        conn.close()


def set_clock(home: Home, when: float) -> None:
    path = home.root / "clock"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(repr(when))
    os.replace(tmp, path)


def start_sweeper(home: Home, monkeypatch, clock: float | None = None) -> Proc:
    """The real sweeper process, in Europe/Berlin, on the test clock when ``clock`` is given."""
    monkeypatch.setenv("TZ", TZ)
    if clock is not None:
        set_clock(home, clock)
        monkeypatch.setenv(CLOCK_ENV, str(home.root / "clock"))
    else:
        monkeypatch.delenv(CLOCK_ENV, raising=False)
    return Proc(home, "sweeper", module="tests.clocked_sweeper")  # the test clock passed in when set


def events(proc: Proc, name: str) -> list[dict]:
    found = []
    for line in proc.log_text().splitlines():
        if f'"event":"{name}"' in line:
            found.append(json.loads(line))
    return found


def wait_for(proc: Proc, name: str, count: int = 1, timeout: float = 20.0) -> list[dict]:
    def seen() -> bool:
        if not proc.alive():
            raise AssertionError(f"the sweeper exited with {proc.popen.poll()}:\n{proc.log_text()[-3000:]}")
        return len(events(proc, name)) >= count

    wait_until(seen, timeout=timeout, interval=0.05, what=f"{count} {name} line(s) in the sweeper's log")
    return events(proc, name)


@contextlib.contextmanager
def running(config: str, fill: Callable[[apsw.Connection, Home], None] | None = None
            ) -> Iterator[tuple[Home, list]]:
    """A home with ``config``, seeded by ``fill(conn, home)`` before its writer starts; yields (home, procs):
    processes appended to procs are stopped too (the writer last). Nothing is left behind."""
    home = make_home(config)
    procs: list[Proc] = []
    try:
        if fill is not None:
            seed(home, fill)
        procs.append(start_writer(home))
        yield home, procs
    finally:
        for proc in reversed(procs):
            proc.stop()
        remove_home(home)


def touch(path: Path, when: float, data: bytes = b"x") -> Path:
    """A file with ``data`` last modified at ``when``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (when, when))
    return path
