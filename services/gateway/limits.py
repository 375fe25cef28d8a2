"""Pacing of platform calls: at most N calls per period per key (a sliding window or a leaky bucket), and a
cooldown after a 429."""

from __future__ import annotations

import asyncio
import time
from collections import deque


class Window:
    """At most ``limit`` calls in any ``period`` seconds (a sliding window), plus a cooldown a 429 sets.

    ``wait()`` sleeps until a call may go and records it. One Window per key (a chat, a bot, a group):
    waiting on one chat's window never holds up another's.
    """

    def __init__(self, limit: int, period: float) -> None:
        self.limit = limit
        self.period = period
        self.calls: deque[float] = deque()
        self.blocked_until = 0.0
        self._lock = asyncio.Lock()

    def delay(self, now: float | None = None) -> float:
        """Seconds until a call may go (0: now)."""
        now = time.monotonic() if now is None else now
        while self.calls and self.calls[0] <= now - self.period:
            self.calls.popleft()
        wait = max(0.0, self.blocked_until - now)
        if len(self.calls) >= self.limit:
            wait = max(wait, self.calls[0] + self.period - now)
        return wait

    async def wait(self) -> None:
        async with self._lock:  # callers go in turn, so a burst is spread, not stampeded
            while (pause := self.delay()) > 0:
                await asyncio.sleep(pause)
            self.calls.append(time.monotonic())

    def cool_down(self, seconds: float) -> None:
        """The platform said "retry after": nothing goes on this key before then."""
        self.blocked_until = max(self.blocked_until, time.monotonic() + seconds)


class Bucket:
    """A leaky bucket as aiolimiter's AsyncLimiter (python-telegram-bot's AIORateLimiter): a burst of ``limit``
    calls at once, then one every ``period / limit`` seconds as the bucket drains. Unlike a sliding window it
    never holds a whole period after a burst: a second's worth of calls go in the next second, evenly."""

    def __init__(self, limit: int, period: float) -> None:
        self.limit = limit
        self.rate = limit / period  # calls a second the bucket drains
        self.level = 0.0
        self.at = time.monotonic()
        self._lock = asyncio.Lock()

    def delay(self, now: float | None = None) -> float:
        """Seconds until a call may go (0: now)."""
        now = time.monotonic() if now is None else now
        level = max(0.0, self.level - (now - self.at) * self.rate)
        return max(0.0, (level + 1 - self.limit) / self.rate)

    async def wait(self) -> None:
        async with self._lock:  # callers go in turn (FIFO), so no chat is starved by another
            while (pause := self.delay()) > 0:
                await asyncio.sleep(pause)
            now = time.monotonic()
            self.level = max(0.0, self.level - (now - self.at) * self.rate) + 1
            self.at = now


class Windows:
    """Windows (or Buckets: ``kind``) by key, made on first use; idle ones are dropped so the map stays small."""

    def __init__(self, limit: int, period: float, keep: int = 10_000, kind: type = Window) -> None:
        self.limit = limit
        self.period = period
        self.keep = keep
        self.kind = kind
        self._windows: dict[str, Window | Bucket] = {}

    def __getitem__(self, key: str):
        window = self._windows.get(key)
        if window is None:
            if len(self._windows) >= self.keep:
                self._prune()
            window = self._windows[key] = self.kind(self.limit, self.period)
        return window

    def _prune(self) -> None:
        now = time.monotonic()
        for key in [k for k, w in self._windows.items() if w.delay(now) == 0 and not w._lock.locked()]:
            del self._windows[key]
