"""Outbox delivery, the kit's whole outbound path: claim the head of each chat's queue for this process's
instances (a lease), render and split the row with its platform's renderer and limits, send its parts in
order through the platform's calls (an ``Outbound``), and tell the writer how it went. Chats go in
parallel, each in order. A platform supplies only its API calls, its renderer, its limits and the meaning
of its errors, as its Channel's ``outbound()``.

A row held by a gateway that died is taken back at once by its successor under the same name (the
enlistment, common/runtime.py), or by anyone once its lease runs out; parts of a long message already
delivered are recorded (OutboxProgress), so only the one call in flight at a crash can repeat.

What a delivery reports (sent, failed, parts sent) is kept and sent again while the writer's condition
lasts (a full disk, a restarting writer: common/holding.py), under one idempotency key, and the row's
lease is renewed meanwhile: a message that went out is never sent a second time because its report
could not be recorded before the lease ran out.

With streaming on (services/gateway/drafts.py) the answer's first part may go as an edit of the placeholder
message the draft showed (groups, Slack): an edit repeated after a crash shows nothing twice.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from common import bus, holding
from common.errors import StarlingError, WriteRejected
from schema import messages as m
from services.gateway.channel import Failed, Outcome, Progress, Retry, Sent

if TYPE_CHECKING:
    from services.gateway.base import Gateway

POLL_S = 1.0          # rows whose retry time came, and lost events, are found by this poll
IN_FLIGHT = 64        # rows sent at once by one process (each from a different chat)
GIVE_UP_AFTER_S = 86400.0  # a row still not deliverable a day after it was queued is failed (by age, not count:
MAX_ATTEMPTS = 200         # an outage or a token not set yet must not fail replies); the count bounds old rows
STOP_GRACE_S = 3.0         # at stop, sends under way get this long to finish before they are cut
BACKOFF_S = (2.0, 300.0)
EDIT_WAIT_S = 10.0  # a placeholder's edit refused for a while (429) is tried once more after this at most
OFF_LOOP_CHARS = 4_000  # longer texts are rendered in a thread, so one big answer never stalls other chats


def backoff(attempt: int) -> float:
    return min(BACKOFF_S[1], BACKOFF_S[0] * 2 ** max(0, attempt - 1))


class Deliverer:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.log = gateway.log
        self.worker = gateway.worker
        self.lease_s = gateway.svc.cfg.gateways.outbox_lease_s  # [gateways] outbox_lease_s
        self.in_flight: dict[int, asyncio.Task] = {}
        self.wake = asyncio.Event()
        self.repeats = 0  # rows taken over after another attempt may have sent them (counted, DESIGN rule 5)

    async def run(self) -> None:
        gw = self.gateway
        instances = list(gw.channels)  # events for all; claims only for channels that started (below)
        events = bus.EventSubscriber(gw.svc.endpoints.events, gw.svc.key, [m.topic_outbox(i) for i in instances])
        events.start()
        pump = asyncio.create_task(self._pump(events))
        try:
            while True:
                self.wake.clear()
                room = IN_FLIGHT - len(self.in_flight)
                started = [c.id for c in gw.channels.values() if c.started]  # not a bot whose token is missing
                full = False
                if room > 0 and started:
                    full = await self._claim(started, room)
                if not full:
                    try:
                        await asyncio.wait_for(self.wake.wait(), POLL_S)
                    except asyncio.TimeoutError:
                        pass
        finally:
            pump.cancel()
            events.close()

    async def _pump(self, events: bus.EventSubscriber) -> None:
        while True:
            if await events.drain(5.0):
                self.wake.set()

    async def _claim(self, instances: list[str], room: int) -> bool:
        """Claim and start rows; True when the claim came back full (more may be waiting)."""
        try:
            claim = await self.gateway.call(m.ClaimOutbox(worker=self.worker, instances=instances, limit=room,
                                                          lease_s=self.lease_s))
        except StarlingError as exc:
            self.log.warning("outbox_claim_failed", error=str(exc))
            await asyncio.sleep(POLL_S)
            return False
        for item in claim.items:
            if item.id not in self.in_flight:
                self.in_flight[item.id] = asyncio.create_task(self._deliver(item))
        return len(claim.items) >= room

    async def _deliver(self, item: m.OutboxItem) -> None:
        channel = self.gateway.channels[item.instance]
        log = channel.log.bind(outbox_id=item.id, chat=item.chat, session_id=item.session_id, attempt=item.attempt)
        if item.attempt > 1 and item.parts_sent == 0:
            self.repeats += 1  # an earlier attempt may have reached the platform before it died
            log.info("outbox_retaken", repeats=self.repeats)
        renew = asyncio.create_task(self._renew(item.id))

        progressed: list[int] = []

        async def progress(parts: int, platform_msg_id: str) -> None:  # recorded before the next part goes
            await self._report(m.OutboxProgress(id=item.id, worker=self.worker, parts_sent=parts,
                                                platform_msg_id=platform_msg_id), log)
            progressed.append(parts)

        try:
            try:
                out = channel.outbound()
                if out is None:  # not started (yet): claims are for started channels, so a moment's race
                    outcome: Outcome = Retry(backoff(item.attempt), f"{channel.id}: not started")
                else:
                    placeholder = await self.gateway.drafts.take(item)
                    try:
                        outcome = await send_row(out, item, progress, placeholder)
                    except Exception as exc:  # the network, a timeout, a platform 5xx: try again later
                        outcome = Retry(backoff(item.attempt), f"{type(exc).__name__}: {exc}")
                    if placeholder and isinstance(outcome, Retry) and not progressed:
                        self.gateway.drafts.give_back(item, placeholder)  # the next attempt edits it still
            except asyncio.CancelledError:
                raise
            except WriteRejected:
                raise
            except Exception as exc:  # the network, a timeout, a platform 5xx: try again later
                outcome = Retry(backoff(item.attempt), f"{type(exc).__name__}: {exc}")
            age = time.time() - item.created_at if item.created_at else 0.0
            if isinstance(outcome, Retry) and (age > GIVE_UP_AFTER_S or item.attempt >= MAX_ATTEMPTS):
                outcome = Failed(f"gave up after {age / 3600:.0f} h and {item.attempt} attempts: {outcome.error}")
            await self._record(item, outcome, log)
        except WriteRejected as exc:
            if exc.code == "lease_lost":
                log.warning("outbox_lease_lost", detail="another gateway took this row; its delivery counts")
            else:  # the row stays held until its lease runs out, then it is tried again
                log.error("outbox_report_failed", code=exc.code, error=str(exc))
        except StarlingError as exc:  # the writer did not answer: the lease runs out and the row comes back
            log.warning("outbox_report_failed", error=str(exc))
        finally:
            renew.cancel()
            self.in_flight.pop(item.id, None)
            self.wake.set()

    async def _record(self, item: m.OutboxItem, outcome: Outcome, log) -> None:
        if isinstance(outcome, Sent):
            await self._report(m.OutboxSent(id=item.id, worker=self.worker, platform_msg_id=outcome.platform_msg_id), log)
            log.info("outbox_sent", platform_msg_id=outcome.platform_msg_id)
        elif isinstance(outcome, Retry):
            after = min(86400.0, max(0.0, outcome.after_s))
            await self._report(m.OutboxFailed(id=item.id, worker=self.worker, error=outcome.error,
                                              retry_after_s=after), log)
            log.warning("outbox_retry", after_s=after, error=outcome.error)
        else:
            await self._report(m.OutboxFailed(id=item.id, worker=self.worker, error=outcome.error), log)
            log.warning("outbox_failed", error=outcome.error)

    async def _report(self, op: m.WriteOp, log) -> None:
        """The report is kept and sent again while the writer's condition lasts (the lease is renewed
        meanwhile by _renew); only a refusal (lease_lost, ...) ends it."""
        await holding.call(self.gateway.rt.client, op, log=log)

    async def _renew(self, outbox_id: int) -> None:
        every = self.lease_s / 3
        while True:
            await asyncio.sleep(every)
            try:  # the writer's condition: tried again (with backoff) until the next renewal is due
                await asyncio.wait_for(holding.call(self.gateway.rt.client, m.RenewLease(
                    kind="outbox", id=outbox_id, worker=self.worker, lease_s=self.lease_s)), every)
            except (StarlingError, asyncio.TimeoutError) as exc:
                self.log.warning("outbox_renew_failed", outbox_id=outbox_id, error=str(exc) or type(exc).__name__)

    async def release_all(self) -> None:
        """At stop: sends under way get a moment to finish; what is still held then is handed back, so
        another gateway (or the next start) takes it at once. Its attempt counts: a cut call may have
        reached the platform, so a repeat is counted (outbox_retaken), not hidden."""
        tasks = list(self.in_flight.values())
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_GRACE_S)
        held = list(self.in_flight)
        for task in list(self.in_flight.values()):
            task.cancel()
        await asyncio.gather(*self.in_flight.values(), return_exceptions=True)
        if held:
            try:
                await asyncio.wait_for(self.gateway.call(m.ReleaseOutbox(ids=held, worker=self.worker,
                                                                         untouched=False)), 2.0)
            except (StarlingError, asyncio.TimeoutError) as exc:
                self.log.warning("outbox_release_failed", ids=held, error=str(exc))


# ------------------------------------------------------------ one row: render, split, send


class Part(NamedTuple):
    kind: str  # text | file
    text: str  # the rendered text, or the file's caption ("": none)


class Outbound:
    """A platform's half of the outbound path: its renderer, its limits and its calls. The kit
    (``send_row``) decides the parts, their order, where a crashed delivery resumes and what is recorded.
    Calls raise the platform's own errors; ``outcome`` says what each one means for the row."""

    caption_max = 0          # a file's caption, as ``measure`` counts; longer text goes after the file
    file_max = 0             # bytes
    platform = ""

    def measure(self, text: str) -> int:
        return len(text)

    def render(self, body: str) -> list[str]:
        """The agent's Markdown as the platform's markup, split at its limit (never over it)."""
        raise NotImplementedError

    def ready(self, item: m.OutboxItem) -> Outcome | None:
        """An outcome when the row cannot be sent now at all (not connected), else None."""
        return None

    async def send_text(self, item: m.OutboxItem, index: int, text: str, last: bool) -> str:
        """Send one text part; return the platform's message id."""
        raise NotImplementedError

    async def send_file(self, item: m.OutboxItem, path: Path, caption: str) -> str:
        raise NotImplementedError

    async def edit_text(self, item: m.OutboxItem, message_id: str, text: str, last: bool) -> str:
        """Edit the draft's placeholder into this (the first) part; raise to have it sent as a new message."""
        raise NotImplementedError

    async def drop_placeholder(self, item: m.OutboxItem, message_id: str) -> None:
        """A placeholder the final answer could not take: delete it (best effort)."""

    async def outcome(self, exc: Exception, item: m.OutboxItem) -> Outcome | None:
        """What a platform error means for the row (None: not the platform's; retried with backoff)."""
        return None

    async def send(self, item: m.OutboxItem, progress: Progress) -> Outcome:
        return await send_row(self, item, progress)

    # streamed drafts (services/gateway/drafts.py); a platform without them keeps these

    def draft_kind(self, chat: str) -> str:
        """How a draft shows in ``chat``: "" (not at all), "preview" (ephemeral, the answer supersedes it)
        or "placeholder" (a message posted, then edited; the answer's first part replaces it)."""
        return ""

    def draft_room(self, chat: str, placeholder: str = "") -> bool:
        """Whether a draft may go now without making an answer wait for the platform's pace (``placeholder``:
        the message it would edit, "" when it would post a new one)."""
        return True

    async def show_draft(self, chat: str, draft_id: int, text: str, placeholder: str, reply_to: str) -> str:
        """Show ``text`` (rendered, within the limit); return the placeholder's message id ("" for a preview)."""
        raise NotImplementedError

    def draft_wait(self, exc: Exception) -> float | None:
        """Seconds a failed draft asks to wait (a 429), or None: this answer's drafts stop."""
        return None


def parts_of(out: Outbound, item: m.OutboxItem) -> list[Part] | Failed:
    """An outbox row as platform messages, in sending order: its text parts; for a file, the file first, with
    the text as its caption when it is one part that fits the caption, else the text after it."""
    body = item.body.strip()
    texts = out.render(body) if body else []
    if item.kind != "file":
        return [Part("text", t) for t in texts]
    path = Path(item.file_path)
    if not path.is_file():
        return Failed(f"file not found: {item.file_path}")
    size = path.stat().st_size
    if size > out.file_max:
        return Failed(f"file too large for {out.platform} ({size // 1_048_576} MB, limit"
                      f" {out.file_max // 1_048_576} MB)")
    caption = texts[0] if len(texts) == 1 and out.measure(texts[0]) <= out.caption_max else ""
    return [Part("file", caption)] + ([] if caption else [Part("text", t) for t in texts])


async def send_row(out: Outbound, item: m.OutboxItem, progress: Progress, placeholder: str = "") -> Outcome:
    """Send the row's parts from ``parts_sent`` on, recording each but the last before the next goes, so
    only the one call in flight at a crash can repeat. ``placeholder``: a message the draft showed, edited
    into the first part (an edit that fails is sent as a new message, the placeholder deleted)."""
    early = out.ready(item)
    if early is not None:
        return early
    long = len(item.body) >= OFF_LOOP_CHARS
    parts = await asyncio.to_thread(parts_of, out, item) if long else parts_of(out, item)
    if isinstance(parts, Failed):
        return parts
    if not parts:
        if placeholder:
            await _drop(out, item, placeholder)
        return Sent("")
    message_id = ""
    first = min(item.parts_sent, len(parts))
    if first > 0:
        placeholder = ""  # resumed past the first part, which may be that very message: left alone
    elif placeholder and parts[0].kind != "text":
        await _drop(out, item, placeholder)
        placeholder = ""
    for index in range(first, len(parts)):
        part, last = parts[index], index == len(parts) - 1
        try:
            if part.kind == "file":
                message_id = await out.send_file(item, Path(item.file_path), part.text)
            elif placeholder and index == 0:
                message_id = await _edit_or_send(out, item, placeholder, part.text, last)
            else:
                message_id = await out.send_text(item, index, part.text, last)
        except (asyncio.CancelledError, WriteRejected):
            raise
        except Exception as exc:
            outcome = await out.outcome(exc, item)
            if outcome is None:
                raise
            return outcome
        if not last:
            await progress(index + 1, message_id)
    return Sent(message_id)


async def _edit_or_send(out: Outbound, item: m.OutboxItem, placeholder: str, text: str, last: bool) -> str:
    for attempt in range(2):
        try:
            return await out.edit_text(item, placeholder, text, last)
        except (asyncio.CancelledError, WriteRejected):
            raise
        except Exception as exc:
            outcome = await out.outcome(exc, item)
            if attempt == 0 and isinstance(outcome, Retry) and outcome.after_s <= EDIT_WAIT_S:
                await asyncio.sleep(outcome.after_s)  # a flood wait or a hiccup: the edit once more
                continue
            out_log = getattr(out, "log", None)
            if out_log is not None:
                out_log.info("placeholder_not_edited", outbox_id=item.id, error=str(exc) or type(exc).__name__,
                             fallback="sent as a new message")
            break
    # deleted by someone, too old to edit, still refused: the answer goes as a message of its own
    message_id = await out.send_text(item, 0, text, last)
    await _drop(out, item, placeholder)
    return message_id


async def _drop(out: Outbound, item: m.OutboxItem, placeholder: str) -> None:
    try:
        await out.drop_placeholder(item, placeholder)
    except Exception:  # best effort: a stale placeholder is untidy, never a lost answer
        pass
