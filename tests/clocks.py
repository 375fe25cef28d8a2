"""Test clocks the scheduler and the sweeper are started with (tests/clocked_scheduler.py,
tests/clocked_sweeper.py), each read from a file named by an environment variable the test sets.

- The scheduler's (``STARLING_TEST_CLOCK=/path/clock.json``): a JSON object ``{"virtual": V, "real": R,
  "scale": S}``; now is ``V + (time.time() - R) * S``. A scale of 3600 runs an hour of schedule per
  second; 0 stops the clock at V. Read on every look, so a test can stop, move and restart it while the
  scheduler runs (write it atomically: a temporary file, then rename).
- The sweeper's (``STARLING_SWEEPER_CLOCK=/path/to/file``): a unix time as text, read on every use; a
  missing, empty or unreadable file means wall time.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from services.scheduler.clock import Clock as SchedulerClock
from services.sweeper.clock import Clock as SweeperClock

SCHEDULER_ENV = "STARLING_TEST_CLOCK"
SWEEPER_ENV = "STARLING_SWEEPER_CLOCK"
TEST_MAX_SLEEP_S = 0.05  # a test clock can be moved at any time: look at it often


class FileClock(SchedulerClock):
    is_test = True
    max_sleep_s = TEST_MAX_SLEEP_S

    def __init__(self, path) -> None:
        self.path = Path(path)
        self._last = (0.0, 0.0, 1.0)

    def now(self) -> float:
        virtual, real, scale = self._read()
        return virtual + (time.time() - real) * scale

    def real_seconds(self, virtual_seconds: float) -> float:
        scale = self._read()[2]
        return virtual_seconds / scale if scale > 0 else math.inf

    def describe(self) -> dict:
        virtual, real, scale = self._read()
        return {"clock_file": str(self.path), "virtual": virtual, "real": real, "scale": scale}

    def _read(self) -> tuple[float, float, float]:
        try:
            data = json.loads(self.path.read_text())
            reading = (float(data["virtual"]), float(data["real"]), float(data["scale"]))
        except (OSError, ValueError, KeyError, TypeError):
            return self._last  # mid-replace or broken: keep the last good reading
        if all(math.isfinite(v) for v in reading) and reading[2] >= 0:
            self._last = reading
        return self._last


class FileTime(SweeperClock):
    def __init__(self, path) -> None:
        self.path = str(path)
        self.note = f"the sweeper's time is read from {self.path} (a test clock)"

    def now(self) -> float:
        try:
            with open(self.path) as f:
                value = float(f.read().strip())
            if math.isfinite(value):
                return value
        except (OSError, ValueError):
            pass
        return time.time()
