"""Streaming answers in the chat: the runner's drafts (``AnswerDraft`` on ``topic_draft(instance)``, the whole
text so far of one model step) shown while the model writes, at most one update a second per chat.

A draft is a hint: nothing here is durable and nothing is retried for its own sake. The answer is still its
outbox row, delivered by services/gateway/delivery.py under the rule of durability; when that row comes,
``take`` stops the chat's drafts (after waiting for the call in flight) and hands over the placeholder
message a draft posted, which the row's first part replaces by an edit (groups, Slack). A draft that cannot
be shown (an API error, a lost hint, a gateway restarted mid-stream) loses nothing: the row still goes.

How a platform shows one (``Outbound.draft_kind``): "preview" is an ephemeral preview that the final
message supersedes (Telegram's sendMessageDraft, private chats only); "placeholder" is one message posted
on the first draft and edited after (Telegram groups, Slack). A draft is rendered with the platform's
renderer and split at its limit; the last part shows (the tail), so no draft is ever over the limit.

Why the answer edits the placeholder rather than deleting it and sending anew: one call less per answer on
the paces that bind (a Telegram group's 20 a minute; Slack's chat.update and chat.delete share tier 3, 50 a
minute per workspace), the message neither flickers nor jumps, it keeps the quote of the question the
placeholder was posted with, and an edit repeated after a crash shows nothing twice where a send would. The
price: a group is notified once, by the placeholder's first words, not by the whole answer.

The placeholders still open are kept in a small file of the process (``data/run/<process>.placeholders``,
written when one is posted or taken), so a successor under the same name after a kill -9 goes on editing
the same message and the answer still ends in one message. The file is a hint like the drafts: lost, the
old placeholder stays as it was (a part of the answer) and the answer comes as a message of its own. A draft
that says its step is done never posts a new placeholder nor a first preview: the answer is on its way.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from common import bus
from common.home import write_private_file
from schema import messages as m
from services.gateway.delivery import OFF_LOOP_CHARS, Outbound

if TYPE_CHECKING:
    from services.gateway.base import Gateway

EVERY_S = 1.0         # at most one draft update a second per chat
FIRST_AFTER_S = 0.5   # a quick answer needs no draft: the first goes this long after the turn's first hint
NO_ROOM_S = 0.25      # the platform's pace is busy with answers: a draft looks again after this
CALL_WAIT_S = 10.0    # an answer waits this long at most for a draft call in flight (its placeholder)
FORGET_S = 600.0      # a chat's drafts no answer took (a turn that failed, a row another process took)


@dataclass
class View:
    """One chat's draft: the turn and step it shows, what it shows, and its placeholder message."""

    instance: str
    chat: str
    turn_id: int
    session_id: int
    step: int = 0
    text: str = ""          # the latest draft's text (Markdown)
    done: bool = False      # the latest draft closed its step
    shown: str = ""         # the rendered text last shown
    placeholder: str = ""   # the message a draft posted ("placeholder" platforms)
    reply_to: str = ""      # the message the turn answers (a group's placeholder quotes it, as the answer would)
    last_at: float = field(default_factory=lambda: time.monotonic() + FIRST_AFTER_S - EVERY_S)
    until: float = 0.0      # a 429's retry_after
    touched: float = field(default_factory=time.monotonic)
    taken: bool = False
    broken: bool = False
    task: asyncio.Task | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def draft_id(self) -> int:
        return self.turn_id % 2_000_000_000 + 1  # Telegram: a non-zero int; one per turn animates its changes


class Drafts:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.log = gateway.log
        self.views: dict[tuple[str, str], View] = {}
        self.closed: dict[tuple[str, str], tuple[int, int]] = {}  # (turn, step) an answer took, per chat
        self.shown = self.failed = self.placeholders = 0
        self._saving: set[asyncio.Task] = set()
        self.file = gateway.paths.run_dir / f"{gateway.svc.name}.placeholders"
        self._load()

    def instances(self) -> list[str]:
        streams = self.gateway.svc.cfg.gateways.streams
        return [i for i in self.gateway.channels if streams(i)]

    async def run(self) -> None:
        instances = self.instances()
        if not instances:
            return
        events = bus.EventSubscriber(self.gateway.svc.endpoints.events, self.gateway.svc.key,
                                     [m.topic_draft(i) for i in instances])
        events.start()
        try:
            while True:
                event = await events.next(5.0)
                try:
                    if isinstance(event, m.AnswerDraft):
                        self.show(event)
                    self._forget()
                except Exception as exc:  # a draft is a hint: never worth the gateway
                    self.log.warning("draft_skipped", error=str(exc) or type(exc).__name__)
        finally:
            events.close()
            for view in self.views.values():
                if view.task is not None:
                    view.task.cancel()

    def show(self, draft: m.AnswerDraft) -> None:
        channel = self.gateway.channels.get(draft.instance)
        out = channel.outbound() if channel is not None else None
        if out is None or not out.draft_kind(draft.chat):
            return
        key = (draft.instance, draft.chat)
        if (draft.turn_id, draft.step) <= self.closed.get(key, (0, -1)):
            return  # late: the answer of this step was delivered already
        view = self.views.get(key)
        if view is not None and draft.turn_id < view.turn_id:
            return
        if view is None or draft.turn_id != view.turn_id:  # a new turn (an old view no answer took is left)
            if view is not None and view.task is not None:
                view.task.cancel()
            view = self.views[key] = View(draft.instance, draft.chat, draft.turn_id, draft.session_id,
                                          reply_to=self.gateway.typing.replying_to(draft.instance, draft.chat))
        if draft.step < view.step:
            return
        view.step, view.text, view.done, view.touched = draft.step, draft.text, draft.done, time.monotonic()
        if view.broken:
            return
        if view.task is None or view.task.done():
            view.task = asyncio.create_task(self._update(view, out))

    async def take(self, item: m.OutboxItem) -> str:
        """An answer row is being delivered: its turn's drafts stop (the call in flight finishes first);
        returns the placeholder its first part should replace ("" when there is none)."""
        key = (item.instance, item.chat)
        view = self.views.get(key)
        if view is None or item.kind != "text" or not item.turn_id or item.turn_id != view.turn_id:
            return ""
        del self.views[key]
        self.closed[key] = (view.turn_id, view.step)
        view.taken = True
        view.wake.set()
        if view.task is not None and not view.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(view.task), CALL_WAIT_S)
            except asyncio.TimeoutError:
                self.log.warning("draft_call_slow", chat=item.chat, detail="the answer goes without its placeholder")
                return ""
            except Exception:  # the updater logs its own failures
                pass
        if view.placeholder:
            await self._save()
        return view.placeholder

    def give_back(self, item: m.OutboxItem, placeholder: str) -> None:
        """The answer's attempt failed before it used its placeholder: the next attempt takes it again."""
        key = (item.instance, item.chat)
        if key not in self.views:
            self.views[key] = View(item.instance, item.chat, item.turn_id, item.session_id,
                                   step=self.closed.get(key, (0, 0))[1], placeholder=placeholder, taken=False)
            task = asyncio.get_running_loop().create_task(self._save())
            self._saving.add(task)
            task.add_done_callback(self._saving.discard)

    async def _update(self, view: View, out: Outbound) -> None:
        """Show the view's latest text, paced, until it shows what the runner sent last (or it is taken)."""
        log = self.log.bind(instance=view.instance, chat=view.chat, turn_id=view.turn_id)
        while not view.taken:
            now = time.monotonic()
            wait = max(view.last_at + EVERY_S - now, view.until - now)
            if wait <= 0 and not out.draft_room(view.chat, view.placeholder):
                wait = NO_ROOM_S
            if wait > 0:
                view.wake.clear()
                try:
                    await asyncio.wait_for(view.wake.wait(), wait)
                except asyncio.TimeoutError:
                    pass
                continue
            text = await self._tail(out, view.text)
            if not text or text == view.shown or (view.done and not view.shown and not view.placeholder):
                return
            view.last_at = time.monotonic()
            try:
                placeholder = await out.show_draft(view.chat, view.draft_id, text, view.placeholder, view.reply_to)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                after = out.draft_wait(exc)
                self.failed += 1
                if after is None:  # nothing is lost: the answer still comes as its outbox row
                    view.broken = True
                    log.warning("draft_failed", error=str(exc) or type(exc).__name__, detail="drafts of this"
                                " answer stop; the answer is delivered as usual")
                    return
                view.until = time.monotonic() + after
                log.info("draft_waits", after_s=after)
                continue
            new = placeholder and not view.placeholder
            view.placeholder = placeholder or view.placeholder
            if new:
                self.placeholders += 1
                await self._save()
            view.shown = text
            self.shown += 1

    @staticmethod
    async def _tail(out: Outbound, text: str) -> str:
        text = text.strip()
        if not text:
            return ""
        parts = await asyncio.to_thread(out.render, text) if len(text) >= OFF_LOOP_CHARS else out.render(text)
        return parts[-1] if parts else ""

    async def _save(self) -> None:
        """The open placeholders, for a successor after a crash (best effort: a hint, like the drafts)."""
        rows = [{"instance": v.instance, "chat": v.chat, "turn_id": v.turn_id, "session_id": v.session_id,
                 "step": v.step, "placeholder": v.placeholder, "at": time.time()}
                for v in self.views.values() if v.placeholder and not v.taken]
        try:
            await asyncio.to_thread(write_private_file, self.file, json.dumps(rows).encode())
        except OSError as exc:
            self.log.warning("placeholders_not_saved", error=str(exc))

    def _load(self) -> None:
        try:
            rows = json.loads(self.file.read_bytes())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            self.log.warning("placeholders_unreadable", path=str(self.file), error=str(exc))
            return
        for row in rows if isinstance(rows, list) else []:
            try:
                if time.time() - float(row["at"]) > FORGET_S or row["instance"] not in self.gateway.channels:
                    continue
                view = View(str(row["instance"]), str(row["chat"]), int(row["turn_id"]), int(row["session_id"]),
                            step=int(row["step"]), placeholder=str(row["placeholder"]))
            except (KeyError, TypeError, ValueError):
                continue
            self.views[(view.instance, view.chat)] = view
        if self.views:
            self.log.info("placeholders_taken_over", count=len(self.views))

    def _forget(self) -> None:
        now = time.monotonic()
        for key, view in list(self.views.items()):
            if now - view.touched > FORGET_S and (view.task is None or view.task.done()):
                del self.views[key]
        if len(self.closed) > 10_000:
            self.closed.clear()  # (turn, step) only guards against late drafts; an old one is long past

    def close(self) -> None:
        for view in self.views.values():
            if view.task is not None:
                view.task.cancel()
