"""The sweeper's idea of "now": wall time. A test passes its own clock in (``main(clock=...)``;
tests/clocks.py has one read from a file, to put a sweeper a month ahead or at 07:00 tomorrow without
waiting); production code loads none. It moves only the sweeper's windows (retention cutoffs, reset
boundaries, capture ages); heartbeats and health stay on wall time."""

from __future__ import annotations

import time


class Clock:
    note = ""  # a test clock says so in the log

    def now(self) -> float:
        return time.time()
