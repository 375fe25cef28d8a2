"""A turn's answer while the model writes it: the text so far, sent to the writer as a hint (ShowDraft) at most
every DRAFT_EVERY_S and once more, marked done, at the end of each model step.

A draft is not a write: it goes out in one fire-and-forget frame (WriterClient.send_hint), is never acked,
resent or waited on, and losing one loses nothing, since each carries the whole text so far and the final
answer is still the outbox row. Its instance and chat are the claim's, which are the session's, which
FinishTurn's outbox rows carry; its thread is the part of the chat after the first ":" (Slack's
"<channel>:<thread_ts>", Telegram's "<chat>:<topic>"), "" where there is none. Text is redacted like
everything the runner sends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from common.redact import redact
from schema import messages as m

DRAFT_EVERY_S = 0.25


class Drafts:
    """The drafts of one turn. ``on_text`` is the provider's callback; ``end_step`` closes a model step."""

    def __init__(self, send: Callable[[m.ShowDraft], bool], claim: m.TurnClaim, every_s: float = DRAFT_EVERY_S) -> None:
        self._send = send
        self._claim = claim
        self._thread = claim.chat.partition(":")[2]
        self._every_s = every_s
        self.step = 0
        self.sent = 0
        self._text = ""  # the step's latest text
        self._shown = ""  # the step's text last sent
        self._last = -every_s  # monotonic time of the last send
        self._timer: asyncio.TimerHandle | None = None

    def begin_step(self, step: int) -> None:
        self._cancel()
        self.step = step
        self._text = self._shown = ""

    def on_text(self, text: str) -> None:
        """The whole text so far (from "" again when a call is retried): sent now, or when the pace allows."""
        self._text = text
        if self._timer is not None:
            return  # a send is already due; it takes the latest text
        wait = self._last + self._every_s - time.monotonic()
        if wait <= 0:
            self._flush()
        else:
            self._timer = asyncio.get_running_loop().call_later(wait, self._flush)

    def end_step(self, text: str) -> None:
        """The step's model call is done: its whole text, marked done (nothing when it wrote none at all)."""
        self._cancel()
        if text or self._shown:
            self._emit(text, done=True)

    def close(self) -> None:
        self._cancel()

    def _flush(self) -> None:
        self._timer = None
        if self._text != self._shown:
            self._emit(self._text, done=False)

    def _emit(self, text: str, done: bool) -> None:
        claim = self._claim
        self._shown = text
        self.sent += 1
        self._send(m.ShowDraft(instance=claim.instance, chat=claim.chat, thread=self._thread,
                               session_id=claim.session_id, turn_id=claim.turn_id, step=self.step,
                               text=redact(text), done=done))
        self._last = time.monotonic()  # after the send: redacting a long text takes time of its own

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
