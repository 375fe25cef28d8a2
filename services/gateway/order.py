"""A chat's inbound messages handed to the writer one at a time and in order; chats side by side.

Without a window (``window_s = 0``: Telegram, Slack, WhatsApp linked) the order is the order of arrival:
those platforms deliver a chat's events in order. With one (WhatsApp Cloud) it is the order of the
platform's timestamps, ties by arrival, among messages that arrive within ``window_s`` of each other:
Meta posts webhooks concurrently, retries each on its own, and two of one chat can come the wrong way
round. A message waits until the oldest one waiting in its chat has waited ``window_s``, and then the
chat's earliest by timestamp goes first; a message that comes later than that is stored when it comes
(its successors are stored already, and their webhooks answered).

Why here, before the writer, and not in the writer's claim: the order a chat's messages are stored in
is the order of their turns everywhere downstream (the conversation the model reads, recall, the
replies), so putting them right before they are stored makes all of it agree; a claim ordered by
timestamp would reorder only the turns still waiting, and leave the history in arrival order. The
webhook's 200 waits for the store anyway (nothing is acknowledged before it is durable), so the window
costs one short wait per message and nothing else: WhatsApp's timestamps are whole seconds, and a
window of about a second covers what concurrent posts reorder.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from dataclasses import dataclass, field


@dataclass(order=True)
class _Waiting:
    key: tuple[float, int]
    arrived: float = field(compare=False)


@dataclass
class _Chat:
    cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    waiting: list[_Waiting] = field(default_factory=list)  # a heap by (timestamp, arrival)
    running: bool = False
    users: int = 0  # messages in the line or running: the chat's state is dropped when none is


class ChatOrder:
    def __init__(self, window_s: float = 0.0, clock=time.monotonic) -> None:
        self.window_s = window_s
        self.clock = clock
        self._chats: dict[str, _Chat] = {}
        self._seq = itertools.count()

    @contextlib.asynccontextmanager
    async def turn(self, chat: str, sent_at: float = 0.0):
        """Hold ``chat``'s turn for one message sent at ``sent_at`` (the platform's timestamp)."""
        state = self._chats.setdefault(chat, _Chat())
        state.users += 1
        me = _Waiting((sent_at if self.window_s > 0 else 0.0, next(self._seq)), self.clock())
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
            try:
                yield
            finally:
                async with state.cond:
                    state.running = False
                    state.cond.notify_all()
        finally:
            state.users -= 1
            if not state.users and self._chats.get(chat) is state:
                del self._chats[chat]

    def _may_go(self, state: _Chat, me: _Waiting) -> bool:
        return not state.running and state.waiting[0] is me and self._due_in(state, me) == 0

    def _due_in(self, state: _Chat, me: _Waiting) -> float | None:
        """Seconds until the head of the line may go (None: ``me`` is not the head, or one is running)."""
        if state.running or state.waiting[0] is not me:
            return None
        if self.window_s <= 0:
            return 0
        oldest = min(w.arrived for w in state.waiting)
        return max(0, oldest + self.window_s - self.clock())
