"""A chat's inbound messages handed to the writer one at a time and in order; chats side by side.

Without a window (Telegram, Slack, WhatsApp linked) the order is the order of arrival: those platforms
deliver a chat's events in order. With one (``Window``: WhatsApp Cloud) it is the order of the
platform's timestamps, ties by arrival: Meta posts webhooks concurrently, retries each on its own, and
two messages of one chat can come the wrong way round.

A message that may have come ahead of an earlier one waits for it, but never long:
- until its timestamp plus ``skew_s``, on this host's clock. A predecessor has an earlier timestamp
  (timestamps are whole seconds; one of the same second goes by arrival anyway), so it was sent before
  this message's second began and has come by then unless the platform holds it back longer than
  ``skew_s`` (a retry): then it is stored when it comes. A message delivered at once waits on average
  ``skew_s``²/2 (most not at all), which keeps a reply's latency within bench/whatsapp_e2e.py's targets;
- a message delivered late (LATE_S past its timestamp's second: a retry, a backlog after an outage)
  while the platform posts concurrently (two events of the instance in the line at once within
  CONCURRENT_S), which is how a backlog comes the wrong way round: ``late_hold_s`` after its arrival;
- never longer than ``max_hold_s`` after it arrived (a clock behind the platform's), and not at all when
  its timestamp is no later than the last one let go in its chat (an earlier one could no longer go
  before that one).
When the oldest waiting message of a chat is due, the chat's earliest by timestamp goes first.

Why here, before the writer, and not in the writer's claim: the order a chat's messages are stored in
is the order of their turns everywhere downstream (the history the model reads, recall, folding, the
replies); a claim ordered by timestamp would reorder only the turns still pending and leave a history
in which a later message comes before an earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

LAST_KEPT = 10_000  # chats whose last timestamp is remembered
LATE_S = 1.0  # a message delivered this long after its timestamp's second ended is late (a retry, a backlog)
CONCURRENT_S = 10.0  # a platform seen posting two events at once this recently is taken to post concurrently


class Window(NamedTuple):
    skew_s: float      # how long past the start of its successor's second a predecessor may come
    max_hold_s: float  # the longest a message waits after it arrived
    late_hold_s: float = 0.5  # a late message's wait after it arrived, while the platform posts concurrently


@dataclass(order=True)
class _Waiting:
    key: tuple[float, int]  # (timestamp, arrival)
    due: float = field(compare=False)


@dataclass
class _Chat:
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    waiting: list[_Waiting] = field(default_factory=list)  # a heap by key
    running: bool = False
    users: int = 0  # messages waiting or running: the chat's state is dropped when there are none


class ChatOrder:
    def __init__(self, window: Window | None = None, clock=time.time) -> None:
        self.window = window
        self.clock = clock  # the wall clock: timestamps are the platform's
        self._chats: dict[str, _Chat] = {}
        self._last: OrderedDict[str, float] = OrderedDict()  # chat -> timestamp of the last message let go
        self._seq = itertools.count()
        self._inside = 0  # messages waiting or running, in all chats
        self._overlapped = -CONCURRENT_S  # when two were last inside at once (monotonic)

    @contextlib.asynccontextmanager
    async def turn(self, chat: str, sent_at: float = 0.0):
        """Hold ``chat``'s turn for one message sent at ``sent_at`` (the platform's timestamp, 0: unknown)."""
        state = self._chats.setdefault(chat, _Chat())
        state.users += 1
        self._inside += 1
        if self._inside > 1:
            self._overlapped = time.monotonic()
        me = self._entry(chat, sent_at, time.monotonic() - self._overlapped < CONCURRENT_S)
        try:
            async with state.cond:
                heapq.heappush(state.waiting, me)
                state.cond.notify_all()  # a new head (an earlier timestamp) may have come
                try:
                    while not self._may_go(state, me):
                        try:
                            await asyncio.wait_for(state.cond.wait(), self._due_in(state, me))
                        except asyncio.TimeoutError:
                            pass
                except BaseException:  # cancelled while waiting: out of the line, and the next one may go
                    state.waiting.remove(me)
                    heapq.heapify(state.waiting)
                    state.cond.notify_all()
                    raise
                heapq.heappop(state.waiting)
                state.running = True
                self._remember(chat, me.key[0])
            try:
                yield
            finally:
                async with state.cond:
                    state.running = False
                    state.cond.notify_all()
        finally:
            self._inside -= 1
            state.users -= 1
            if not state.users and self._chats.get(chat) is state:
                del self._chats[chat]

    def _entry(self, chat: str, sent_at: float, concurrent: bool) -> _Waiting:
        now = self.clock()
        if self.window is None or sent_at <= 0:
            return _Waiting((0.0 if self.window is None else sent_at, next(self._seq)), now)
        if sent_at <= self._last.get(chat, 0.0):
            due = now
        else:
            due = max(sent_at + self.window.skew_s, now)
            if concurrent and now - sent_at > 1 + LATE_S:  # late, in a burst: a backlog comes unordered
                due = max(due, now + self.window.late_hold_s)
            due = min(due, now + self.window.max_hold_s)
        return _Waiting((sent_at, next(self._seq)), due)

    def _remember(self, chat: str, sent_at: float) -> None:
        if self.window is None or sent_at <= 0:
            return
        self._last[chat] = max(sent_at, self._last.get(chat, 0.0))
        self._last.move_to_end(chat)
        while len(self._last) > LAST_KEPT:
            self._last.popitem(last=False)

    def _may_go(self, state: _Chat, me: _Waiting) -> bool:
        return self._due_in(state, me) == 0

    def _due_in(self, state: _Chat, me: _Waiting) -> float | None:
        """Seconds until ``me`` may go (None: it is not the head of the line, or one is running)."""
        if state.running or state.waiting[0] is not me:
            return None
        soonest = min(w.due for w in state.waiting)
        return max(0, soonest - self.clock())
