"""A WhatsApp number in linked-device mode, inside the gateway: waits for a link, holds the session
while it runs it, connects and reconnects by the policy, hands what arrives to the kit (Gateway.take,
the client's ack once it returned), gives the kit its Outbound (``LinkedOutbound``: the client's calls,
WhatsApp's renderer and limits, a personal number's pace, the meaning of its send errors), and keeps
`starling status` told where the link stands (the channel's status is the heartbeat detail).

The session lock is held only while a session is in use. `starling whatsapp link` and `unlink` ask
through request files beside the session (common/whatsapp_requests.py): while no session runs, the
gateway pairs (linking.py) and then runs the new session, or unlinks; while one runs, an unlink logs it
out and a link is refused.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import AsyncIterator, NamedTuple

from common import whatsapp_requests
from common.errors import StarlingError
from common.whatsapp_requests import LINK_REQUEST, UNLINK_REQUEST
from schema import messages as m
from services.gateway.channel import FileRef, Outcome, Progress, Retry
from services.gateway.delivery import backoff as outbox_backoff
from services.gateway.delivery import send_row
from services.gateway.limits import Window, Windows
from services.gateway.whatsapp import linked, linking
from services.gateway.whatsapp.linked import Backoff, ConnectError, Link, LinkRecord, LogoutReason, SendError, State
from services.gateway.whatsapp.outbound import Markup
from services.gateway.whatsapp.session_vault import SessionBusy, SessionError, SessionVault

POLL_S = 1.0              # a new link, an unlink request: looked for this often
CONNECT_TIMEOUT_S = 60.0  # a connection attempt without connected/disconnected/logged_out counts as failed
LOGOUT_TIMEOUT_S = 15.0
TYPING_EVERY_S = 10.0     # WhatsApp shows "typing…" for about 25 s unless renewed


class Ev(NamedTuple):
    kind: str            # connected | disconnected | logged_out | unlink
    detail: str = ""
    reason: LogoutReason | None = None


class LinkedTransport:
    """Implements `linked.Events` for the client it drives."""

    def __init__(self, channel, make_client: linked.MakeClient | None = None, backoff: Backoff | None = None) -> None:
        self.channel = channel
        self.gateway = channel.gateway
        self.id: str = channel.id
        self.log = channel.log.bind(mode="linked")
        self.make_client = make_client
        self.backoff = backoff or Backoff()
        self.link = Link(self.id, self._changed)
        self.store: SessionVault | None = None
        self.client: linked.LinkedClient | None = None
        self.events: asyncio.Queue[Ev] = asyncio.Queue()
        self.ended = ""                 # the session that logged out here: not connected again
        self.outbound = LinkedOutbound(self)
        self.typed: dict[str, float] = {}
        self.tasks: set[asyncio.Task] = set()
        self.running = False            # heartbeats carry the link's changes once the gateway is ready

    # ------------------------------------------------------------ life

    async def start(self) -> None:
        """Check what can be checked before connecting: the library, the session's key and files."""
        if self.make_client is None:
            self.make_client = linked.client_factory()
        if self.store is None:
            self.store = SessionVault.open(self.gateway.paths, self.id)
        record = LinkRecord.read(self.store)  # SessionError (wrong key, altered): the gateway says so and retries
        if record is not None and record.logged_out:
            known = record.logged_out in LogoutReason.__members__
            self.link.resume(State.LOGGED_OUT, LogoutReason[record.logged_out].value if known else record.logged_out)
        elif record is not None and record.usable:
            self.link.account = record.account
            self.link.resume(State.CONNECTING)
        else:
            self.link.resume(State.UNLINKED)
        self.log.info("whatsapp_ready", mode="linked", link=self.link.status())

    async def run(self) -> None:
        """Forever: wait for a usable session, run it until it logs out or is unlinked, wait again."""
        refused = ""
        self.running = True
        self._changed(self.link)
        while True:
            await self._answer_requests()
            try:
                record = LinkRecord.read(self.store)
            except SessionError as exc:
                if str(exc) != refused:
                    refused = str(exc)
                    self.log.error("whatsapp_session_refused", error=refused)
                    self.channel.status = f"error: {refused}"
                    await self._beat()
                await asyncio.sleep(POLL_S)
                continue
            if refused:
                refused = ""
                self._changed(self.link)
            if record is not None and record.usable and record.session != self.ended:
                try:
                    self.store.lock()
                except SessionBusy:
                    await asyncio.sleep(POLL_S)  # `starling whatsapp link` is at work
                    continue
                try:
                    await self._serve(record)
                finally:
                    await self._drop_client()
                    self.store.unlock()
                continue
            if record is None and self.link.state is not State.UNLINKED and not self.store.busy():
                self.link.account = ""
                self.link.to(State.UNLINKED, "the session was removed")
            await asyncio.sleep(POLL_S)

    async def _answer_requests(self) -> None:
        """`starling whatsapp link|unlink`, while no session runs here."""
        paths, folder = self.gateway.paths, self.store.folder
        request = whatsapp_requests.take(folder / LINK_REQUEST)
        if request is not None:
            self.log.info("whatsapp_linking", by="pair code" if request.get("phone") else "QR code")
            if State.LINKING in linked.ALLOWED[self.link.state]:
                self.link.to(State.LINKING)
            account = await linking.answer_link(paths, self.id, request, self.make_client)
            if account:
                self.link.account = account
                self.log.info("whatsapp_paired", account=account)
            elif self.link.state is State.LINKING:
                self.link.to(State.UNLINKED, "linking did not complete")
        if whatsapp_requests.take(folder / UNLINK_REQUEST) is not None:
            result = await linking.answer_unlink(paths, self.id, self.make_client)
            self.log.info("whatsapp_unlinked", result=result)
            self.link.account = ""
            if self.link.state is not State.UNLINKED:
                self.link.to(State.UNLINKED, "unlinked by the operator")

    async def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await self._drop_client()
        if self.store is not None:
            self.store.unlock()

    async def _drop_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            try:
                await client.close()
            except Exception as exc:  # closing is best effort; the session was saved as it changed
                self.log.warning("whatsapp_close_failed", error=str(exc))

    # ------------------------------------------------------------ one session

    async def _serve(self, record: LinkRecord) -> None:
        self.events = asyncio.Queue()
        self.link.account = record.account
        self.client = self.make_client(self.id, self.store, self, self.log)
        watcher = asyncio.create_task(self._watch_requests())
        attempt, reason, connect_now = 0, "", True
        try:
            while True:
                if connect_now:
                    self.link.to(State.CONNECTING, reason, attempt=attempt, next_at=time.time())
                    ev = await self._attempt()
                else:
                    ev = await self._next(None if self.link.state is State.LINKED else
                                          max(0.0, self.link.next_at - time.time()))
                    if ev is None:  # the wait after a drop is over
                        connect_now = True
                        continue
                connect_now = False
                if ev.kind == "connected":
                    attempt, reason = 0, ""
                    self.link.account = ev.detail or self.link.account
                    self.link.to(State.LINKED)
                    self.log.info("whatsapp_linked", account=self.link.account)
                elif ev.kind == "disconnected":
                    attempt += 1
                    reason = ev.detail or "connection lost"
                    delay = self.backoff.delay(attempt)
                    self.link.to(State.CONNECTING, reason, attempt=attempt, next_at=time.time() + delay)
                    self.log.warning("whatsapp_disconnected", reason=reason, attempt=attempt, retry_in_s=round(delay, 1))
                elif ev.kind == "logged_out":
                    await self._logged_out(record, ev.reason or LogoutReason.UNKNOWN, ev.detail)
                    return
                elif ev.kind == "unlink":
                    await self._unlink(record)
                    return
        finally:
            watcher.cancel()

    async def _attempt(self) -> Ev:
        try:
            await asyncio.wait_for(self.client.connect(), CONNECT_TIMEOUT_S)
        except (StarlingError, asyncio.TimeoutError) as exc:  # ConnectError, or the session's files refused
            if not isinstance(exc, (ConnectError, asyncio.TimeoutError)):
                self.log.error("whatsapp_connect_failed", error=str(exc))
            return Ev("disconnected", str(exc) or "the connection attempt did not start in time")
        ev = await self._next(CONNECT_TIMEOUT_S)
        return ev or Ev("disconnected", f"no answer from WhatsApp in {CONNECT_TIMEOUT_S:.0f}s")

    async def _next(self, timeout: float | None) -> Ev | None:
        try:
            return await asyncio.wait_for(self.events.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def _logged_out(self, record: LinkRecord, reason: LogoutReason, detail: str) -> None:
        self.ended = record.session
        if reason.session_dead:
            await self._drop_client()  # its last save first, then the record says the session is dead
            record.logged_out = reason.name
            record.write(self.store)
        self.link.to(State.LOGGED_OUT, reason.value + (f" ({detail})" if detail else ""))
        self.log.error("whatsapp_logged_out", reason=reason.name, detail=detail or reason.value,
                       hint=f"starling whatsapp link {self.id}")

    async def _unlink(self, record: LinkRecord) -> None:
        try:
            await asyncio.wait_for(self.client.logout(), LOGOUT_TIMEOUT_S)
            result = "unlinked: WhatsApp removed this device from the phone's Linked devices"
        except (SendError, asyncio.TimeoutError, StarlingError) as exc:
            result = (f"unlinked here, but WhatsApp could not be told ({exc or 'no answer in time'}): remove the"
                      " device on the phone too (Settings → Linked devices)")
        await self._drop_client()
        self.store.clear()
        self.ended = record.session
        self.link.account = ""
        self.link.to(State.UNLINKED, "unlinked by the operator")
        self.log.info("whatsapp_unlinked", result=result)
        whatsapp_requests.answer_unlink(self.store.folder, result)

    async def _watch_requests(self) -> None:
        """While the session runs: an unlink logs it out, a link is refused."""
        folder = self.store.folder
        while whatsapp_requests.take(folder / UNLINK_REQUEST) is None:
            if whatsapp_requests.take(folder / LINK_REQUEST) is not None:
                linking.refuse_link(self.gateway.paths, self.id, self.link.account)
            await asyncio.sleep(POLL_S / 4)
        await self.events.put(Ev("unlink"))

    # ------------------------------------------------------------ linked.Events

    async def qr(self, code: str) -> None:
        self.log.warning("whatsapp_pairing_ignored", detail="the gateway does not pair; run `starling whatsapp link`")

    async def pair_code(self, code: str) -> None:
        await self.qr(code)

    async def paired(self, account: str) -> None:
        self.link.account = account

    async def connected(self, account: str) -> None:
        await self.events.put(Ev("connected", account))

    async def disconnected(self, reason: str) -> None:
        await self.events.put(Ev("disconnected", reason))

    async def logged_out(self, reason: LogoutReason, detail: str = "") -> None:
        await self.events.put(Ev("logged_out", detail, reason))

    async def message(self, msg: linked.LinkedMessage) -> None:
        """The kit's inbound path (Gateway.take: parse, a chat's order, access, its file, the writer);
        returned once stored, which is the client's ack. Blue ticks for a new message, after that."""
        if await self.gateway.take(self.channel, linked.as_event(msg)) == "accepted":
            self._spawn(self._mark_read(msg))

    async def download(self, ref: FileRef) -> AsyncIterator[bytes]:
        """A received file's bytes, for the kit (Channel.download), from the client that received it."""
        if self.client is None:
            raise StarlingError("not connected: the file cannot be fetched now")
        data = await self.client.download(ref.ref)

        async def chunks() -> AsyncIterator[bytes]:
            yield data

        return chunks()

    async def _mark_read(self, msg: linked.LinkedMessage) -> None:
        try:
            if self.client is not None:
                await self.client.mark_read(msg.chat, msg.sender, [msg.id])
        except Exception as exc:  # blue ticks are best effort
            self.log.info("read_receipt_failed", platform_msg_id=msg.id, error=str(exc))

    # ------------------------------------------------------------ outbox

    async def send(self, item: m.OutboxItem, progress: Progress) -> Outcome:
        """One outbox row through the kit's path (delivery.send_row) with this number's Outbound."""
        return await send_row(self.outbound, item, progress)

    async def typing(self, chat: str, platform_msg_id: str) -> None:
        if self.client is None or self.link.state is not State.LINKED:
            return
        if time.monotonic() - self.typed.get(chat, -TYPING_EVERY_S) < TYPING_EVERY_S:
            return
        self.typed[chat] = time.monotonic()
        await self.client.typing(chat, True)

    async def typing_done(self, chat: str, platform_msg_id: str) -> None:
        if self.typed.pop(chat, None) is not None and self.client is not None and self.link.state is State.LINKED:
            await self.client.typing(chat, False)

    # ------------------------------------------------------------ status

    def _changed(self, link: Link) -> None:
        self.channel.status = f"linked-device {link.status()}"
        if self.running:
            self._spawn(self._beat())

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)  # the loop holds tasks weakly: keep each until it is done
        task.add_done_callback(self.tasks.discard)

    async def _beat(self) -> None:
        rt = getattr(self.gateway, "rt", None)
        if rt is None:
            return
        try:
            await rt.beat(detail=self.gateway.detail())
        except StarlingError as exc:
            self.log.warning("heartbeat_failed", error=str(exc))


class LinkedOutbound(Markup):
    """The linked device's half of the kit's outbound path (services/gateway/delivery.py): WhatsApp's
    renderer and limits (Markup), the client's calls, a personal number's pace, and its send errors'
    meanings (linked.outcome). Not linked: the row waits (a logged-out number, for a new link)."""

    def __init__(self, transport: LinkedTransport) -> None:
        self.transport = transport
        self.log = transport.log
        self.chats = Windows(1, 1.0)    # a personal number: about one message a second per chat,
        self.number = Window(10, 1.0)   # and ten a second in all (bulk-looking traffic gets numbers banned)

    def ready(self, item: m.OutboxItem) -> Outcome | None:
        link = self.transport.link
        if self.transport.client is not None and link.state is State.LINKED:
            return None
        if link.state in (State.LOGGED_OUT, State.UNLINKED):
            return Retry(linked.LOGGED_OUT_RETRY_S, f"the number is {link.status()}")
        return Retry(min(60.0, outbox_backoff(item.attempt)), f"not connected: {link.status()}")

    async def _client(self, chat: str) -> linked.LinkedClient:
        await self.chats[chat].wait()
        await self.number.wait()
        client = self.transport.client
        if client is None:  # dropped while the part waited its turn
            raise SendError(linked.SendKind.NOT_CONNECTED, "the session ended")
        return client

    async def send_text(self, item: m.OutboxItem, index: int, text: str, last: bool) -> str:
        return await (await self._client(item.chat)).send_text(item.chat, text)

    async def send_file(self, item: m.OutboxItem, path: Path, caption: str) -> str:
        return await (await self._client(item.chat)).send_file(item.chat, path, caption)

    async def outcome(self, exc: Exception, item: m.OutboxItem) -> Outcome | None:
        if not isinstance(exc, SendError):
            return None
        if exc.kind is linked.SendKind.RATE_LIMITED:
            self.chats[item.chat].cool_down(max(exc.retry_after_s, linked.RATE_LIMIT_MIN_S))
        return linked.outcome(exc, item.attempt)
