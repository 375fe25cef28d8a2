"""The scheduler's clock: wall time. A test passes its own clock in (``main(clock=...)``; tests/clocks.py
has one read from a file, so hours of schedule pass in seconds); production code loads none."""

from __future__ import annotations

import math
import time


class Clock:
    is_test = False
    max_sleep_s = math.inf  # how long the scheduler may sleep at once (a test clock can be moved any time)

    def now(self) -> float:
        return time.time()

    def real_seconds(self, virtual_seconds: float) -> float:
        """How long to sleep for ``virtual_seconds`` to pass on this clock (inf when it is stopped)."""
        return virtual_seconds

    def describe(self) -> dict:
        """What the log says of a test clock."""
        return {}
