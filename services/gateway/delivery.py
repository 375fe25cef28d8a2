"""Outbox delivery: claim the head of each chat's queue for this process's instances (a lease), send
it through its channel, and tell the writer how it went. Chats go in parallel, each in order.

A row held by a gateway that died is taken back at once by its successor under the same name (the
enlistment, common/runtime.py), or by anyone once its lease runs out; parts of a long message already
delivered are recorded (OutboxProgress), so only the one call in flight at a crash can repeat.

What a delivery reports (sent, failed, parts sent) is kept and sent again while the writer's condition
lasts (a full disk, a restarting writer: common/holding.py), under one idempotency key, and the row's
lease is renewed meanwhile: a message that went out is never sent a second time because its report
could not be recorded before the lease ran out.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from common import bus, holding
from common.errors import StarlingError, WriteRejected
from schema import messages as m
from services.gateway.channel import Failed, Outcome, Retry, Sent

if TYPE_CHECKING:
    from services.gateway.base import Gateway

POLL_S = 1.0          # rows whose retry time came, and lost events, are found by this poll
IN_FLIGHT = 64        # rows sent at once by one process (each from a different chat)
GIVE_UP_AFTER_S = 86400.0  # a row still not deliverable a day after it was queued is failed (by age, not count:
MAX_ATTEMPTS = 200         # an outage or a token not set yet must not fail replies); the count bounds old rows
STOP_GRACE_S = 3.0         # at stop, sends under way get this long to finish before they are cut
BACKOFF_S = (2.0, 300.0)


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

        async def progress(parts: int, platform_msg_id: str) -> None:  # recorded before the next part goes
            await self._report(m.OutboxProgress(id=item.id, worker=self.worker, parts_sent=parts,
                                                platform_msg_id=platform_msg_id), log)

        try:
            try:
                outcome: Outcome = await channel.send(item, progress)
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
