"""The scheduler's clock: the real one, or (tests only) a virtual one read from a file.

``STARLING_TEST_CLOCK=/path/clock.json`` makes the scheduler read its time from that file, a JSON object
``{"virtual": V, "real": R, "scale": S}``: now is ``V + (time.time() - R) * S``. A scale of 3600 runs an
hour of schedule per second; a scale of 0 stops the clock at V. The file is read on every look at the
time, so a test can stop, move and restart the clock while the scheduler runs (write it atomically:
a temporary file, then rename). Never set it in production: the scheduler logs a warning when it is set.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

ENV = "STARLING_TEST_CLOCK"
TEST_MAX_SLEEP_S = 0.05  # a test clock can be moved at any time: look at it often


class Clock:
    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path else None
        self._last = (0.0, 0.0, 1.0)

    @classmethod
    def from_env(cls) -> Clock:
        return cls(os.environ.get(ENV) or None)

    @property
    def is_test(self) -> bool:
        return self.path is not None

    @property
    def max_sleep_s(self) -> float:
        return TEST_MAX_SLEEP_S if self.is_test else math.inf

    def now(self) -> float:
        if self.path is None:
            return time.time()
        virtual, real, scale = self._read()
        return virtual + (time.time() - real) * scale

    def real_seconds(self, virtual_seconds: float) -> float:
        """How long to sleep for ``virtual_seconds`` to pass on this clock (inf when it is stopped)."""
        if self.path is None:
            return virtual_seconds
        scale = self._read()[2]
        return virtual_seconds / scale if scale > 0 else math.inf

    def describe(self) -> dict:
        if self.path is None:
            return {}
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
