"""The sweeper's idea of "now": wall time, or, for tests only, a time read from a file.

``STARLING_SWEEPER_CLOCK=/path/to/file`` makes the sweeper read now from that file (a unix time as
text), again on every use, so a test can put a sweeper a month ahead, or at 07:00 tomorrow, without
waiting. A missing, empty or unreadable file means wall time. It moves only the sweeper's windows
(retention cutoffs, reset boundaries, capture ages); heartbeats and health stay on wall time. It is a
test hook: never set it on a real home.
"""

from __future__ import annotations

import math
import os
import time

ENV = "STARLING_SWEEPER_CLOCK"


class Clock:
    def __init__(self, path: str | None = None) -> None:
        self.path = path if path is not None else os.environ.get(ENV, "")

    @property
    def injected(self) -> bool:
        return bool(self.path)

    def now(self) -> float:
        if self.path:
            try:
                with open(self.path) as f:
                    value = float(f.read().strip())
                if math.isfinite(value):
                    return value
            except (OSError, ValueError):
                pass
        return time.time()
