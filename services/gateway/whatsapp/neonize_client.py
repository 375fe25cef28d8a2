"""The real linked client: neonize (Python over whatsmeow, in Go), behind `linked.LinkedClient`.

Imported only in linked mode (`pip install -e '.[whatsapp-linked]'`). whatsmeow keeps its keys
(identity, pre-keys, sessions, sender keys, app-state keys) in its own SQLite database, opened by file
name from Go: neonize has no hook to route them through Starling's store. So the database lives
decrypted only in a private working copy (working_copy.py, on /dev/shm) while the client runs and is
saved encrypted into the session store whenever its bytes change (looked at every second, and at once
after pairing, connecting, each received and each sent message) and at stop.

Limits, said plainly: (1) whatsmeow writes a key update to its working copy before Starling can
encrypt it, so a crash (kill -9, power cut) can lose up to a second of key updates; WhatsApp then
re-sends with fresh keys (retry receipts), which usually recovers. (2) neonize hands events over on a
queue and whatsmeow acknowledges a message to WhatsApp before Starling's writer has it, so a crash in
that window loses that message (the Cloud API does not have this gap). (3) Files that people send are
not fetched. None of this has run against WhatsApp's servers: it is written against neonize 0.5.2's
API and checked offline only (import, event registration, its Go core creating the database file).
"""

from __future__ import annotations

import asyncio
import mimetypes
from pathlib import Path

from common.errors import StarlingError
from services.gateway.whatsapp import linked
from services.gateway.whatsapp.linked import (
    ConnectError, LinkedMessage, LogoutReason, SendError, SendKind, jid_user,
)
from services.gateway.whatsapp.working_copy import WorkingCopy, work_folder

SAVE_EVERY_S = 1.0
STOP_WAIT_S = 10.0
IMAGE_TYPES = ("image/jpeg", "image/png")
IMAGE_MAX = 5 * 1024 * 1024
MEDIA_FIELDS = (("imageMessage", "image"), ("videoMessage", "video"), ("audioMessage", "audio"),
                ("documentMessage", "document"), ("stickerMessage", "sticker"))
TRANSIENT = ("not connected", "websocket", "timeout", "timed out", "deadline exceeded", "eof", "connection reset",
             "broken pipe", "server returned error 5", "i/o")
RATE = ("rate-overlimit", "429", "rate limit")
LOGGED_OUT_HINTS = ("not logged in", "logged out")
NO_ACCOUNT = ("not on whatsapp", "no such user", "item-not-found", "404")


def require_neonize() -> None:
    """Raise StarlingError saying what to install when neonize is missing or does not load."""
    try:
        import neonize.aioze.client  # noqa: F401
    except ImportError as exc:
        raise StarlingError(f"linked-device mode needs the neonize library ({exc}); install it with"
                            f" {linked.INSTALL_HINT}") from None
    except (OSError, RuntimeError) as exc:
        raise StarlingError(f"neonize is installed but its Go core does not load ({exc}); reinstall it with"
                            f" {linked.INSTALL_HINT}") from None


def _logout_reason(code: int) -> LogoutReason:
    # neonize's ConnectFailureReason: 2 LOGGED_OUT, 3 TEMP_BANNED, 4 MAIN_DEVICE_GONE, 5 UNKNOWN_LOGOUT, 6 CLIENT_OUTDATED
    return {2: LogoutReason.DEVICE_REMOVED, 3: LogoutReason.BANNED, 4: LogoutReason.MAIN_DEVICE_GONE,
            5: LogoutReason.UNKNOWN, 6: LogoutReason.CLIENT_OUTDATED}.get(code, LogoutReason.UNKNOWN)


def _send_error(exc: Exception) -> SendError:
    text = str(exc)
    low = text.lower()
    if any(h in low for h in RATE):
        return SendError(SendKind.RATE_LIMITED, text, retry_after_s=30.0)
    if any(h in low for h in LOGGED_OUT_HINTS):
        return SendError(SendKind.LOGGED_OUT, text)
    if any(h in low for h in NO_ACCOUNT):
        return SendError(SendKind.NO_ACCOUNT, text)
    if any(h in low for h in TRANSIENT):
        return SendError(SendKind.NETWORK, text)
    return SendError(SendKind.REJECTED, text)  # not retried blindly: the outbox records WhatsApp's words


class NeonizeClient(linked.LinkedClient):
    def __init__(self, instance: str, store, events, log) -> None:
        super().__init__(instance, store, events, log)
        folder, on_tmpfs = work_folder(store)
        if not on_tmpfs:
            log.warning("whatsapp_working_copy_on_disk", folder=str(folder),
                        detail="no /dev/shm: the decrypted session sits in this folder while the gateway runs")
        self.copy = WorkingCopy(store, folder)
        self.client = None
        self.task: asyncio.Task | None = None
        self.saver: asyncio.Task | None = None
        self.save_lock = asyncio.Lock()
        self.phone = ""
        self.code_sent = False
        self.me = ""

    # ------------------------------------------------------------ life

    def _build(self):
        from neonize.aioze import events as ev
        from neonize.aioze.client import NewAClient

        self.copy.restore()
        client = NewAClient(str(self.copy.db), uuid=f"starling-{self.instance}")
        handlers = {ev.ConnectedEv: self._on_connected, ev.PairStatusEv: self._on_pair_status,
                    ev.DisconnectedEv: self._on_disconnected, ev.ConnectFailureEv: self._on_connect_failure,
                    ev.LoggedOutEv: self._on_logged_out, ev.StreamReplacedEv: self._on_replaced,
                    ev.TemporaryBanEv: self._on_temp_ban, ev.ClientOutdatedEv: self._on_outdated,
                    ev.MessageEv: self._on_message}
        for kind, handler in handlers.items():
            client.event(kind)(handler)
        client.event.qr(self._on_qr)
        return client

    async def connect(self) -> None:
        if self.task is not None and not self.task.done():
            return  # whatsmeow reconnects by itself while its connection loop runs
        try:
            if self.client is None:
                self.client = await asyncio.to_thread(self._build)
            self.task = await self.client.connect()
        except StarlingError:
            raise
        except Exception as exc:
            raise ConnectError(f"neonize could not start connecting: {type(exc).__name__}: {exc}") from None
        self.task.add_done_callback(self._loop_ended)
        if self.saver is None:
            self.saver = asyncio.create_task(self._save_loop())

    async def pair(self, phone: str = "") -> None:
        self.phone = "".join(ch for ch in phone if ch.isdigit())
        await self.connect()

    def _loop_ended(self, task: asyncio.Task) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            asyncio.get_running_loop().create_task(self.events.disconnected(f"neonize stopped: {exc}"))

    async def close(self) -> None:
        if self.saver is not None:
            self.saver.cancel()
            self.saver = None
        if self.client is not None:
            try:
                await self.client.disconnect()
            except Exception as exc:
                self.log.info("whatsapp_disconnect_failed", error=str(exc))
            try:
                from neonize._binder import gocode

                await asyncio.to_thread(gocode.Stop, self.client.uuid)
            except Exception as exc:
                self.log.info("whatsapp_stop_failed", error=str(exc))
            if self.task is not None:
                await asyncio.wait([self.task], timeout=STOP_WAIT_S)
        try:
            await self._save()
        finally:
            self.copy.wipe()
            self.client = None

    async def _save(self) -> None:
        async with self.save_lock:
            await asyncio.to_thread(self.copy.save)

    async def _save_loop(self) -> None:
        while True:
            await asyncio.sleep(SAVE_EVERY_S)
            try:
                await self._save()
            except StarlingError as exc:
                self.log.error("whatsapp_session_save_failed", error=str(exc))

    # ------------------------------------------------------------ events from neonize

    async def _on_qr(self, client, data: bytes) -> None:
        if not self.phone:
            await self.events.qr(data.decode(errors="replace"))
            return
        if self.code_sent:
            return
        self.code_sent = True
        try:
            code = await client.PairPhone(self.phone, show_push_notification=True)
        except Exception as exc:
            await self.events.disconnected(f"pair code refused: {exc}")
            return
        await self.events.pair_code(code)

    async def _on_pair_status(self, client, event) -> None:
        if event.Status == 2:  # SUCCESS
            await self._save()
            await self.events.paired(event.ID.User)
        else:
            await self.events.disconnected(f"pairing failed: {event.Error or 'unknown error'}")

    async def _on_connected(self, client, event) -> None:
        try:
            self.me = (await client.get_me()).JID.User or self.me
        except Exception:
            pass
        await self._save()
        await self.events.connected(self.me)

    async def _on_disconnected(self, client, event) -> None:
        await self.events.disconnected("connection lost")

    async def _on_connect_failure(self, client, event) -> None:
        if event.Reason in (2, 4, 5, 6):
            return  # a logged-out event follows with the reason
        await self.events.disconnected(f"connect failure {event.Reason}: {event.Message}".strip())

    async def _on_logged_out(self, client, event) -> None:
        await self._save()
        await self.events.logged_out(_logout_reason(event.Reason), "at connect" if event.OnConnect else "")

    async def _on_replaced(self, client, event) -> None:
        await self.events.logged_out(LogoutReason.REPLACED)

    async def _on_temp_ban(self, client, event) -> None:
        await self.events.disconnected(f"temporarily banned (code {event.Code}) for {event.Expire}s")

    async def _on_outdated(self, client, event) -> None:
        await self.events.logged_out(LogoutReason.CLIENT_OUTDATED)

    async def _on_message(self, client, event) -> None:
        await self._save()  # the decrypt advanced the keys: saved before the message goes anywhere
        try:
            msg = self._map(event)
        except Exception as exc:  # an odd message must never stop the others
            self.log.warning("event_skipped", reason=f"unreadable message: {type(exc).__name__}: {exc}")
            return
        try:
            await self.events.message(msg)
        except Exception as exc:
            # whatsmeow has acknowledged it to WhatsApp already: it will not come again
            self.log.error("inbound_not_acked", platform_msg_id=msg.id, error=str(exc) or type(exc).__name__,
                           detail="the library acknowledged this message before the writer did; it may be lost")

    def _map(self, event) -> LinkedMessage:
        info = event.Info
        src = info.MessageSource
        sender_jid = src.Sender
        if sender_jid.Server == "lid" and src.HasField("SenderAlt") and src.SenderAlt.User:
            sender_jid = src.SenderAlt  # the phone number behind a hidden (LID) sender, when whatsmeow knows it
        chat_jid = src.Chat
        if not src.IsGroup and chat_jid.Server == "lid":
            chat_jid = sender_jid
        chat = f"{chat_jid.User}@{chat_jid.Server}" if src.IsGroup else chat_jid.User
        body = event.Message
        text, kind, name, context = body.conversation, "text", "", None
        if body.HasField("extendedTextMessage"):
            text = body.extendedTextMessage.text
            context = body.extendedTextMessage.contextInfo
        for field, what in MEDIA_FIELDS:
            if body.HasField(field):
                media = getattr(body, field)
                kind = "voice note" if what == "audio" and getattr(media, "PTT", False) else what
                text = getattr(media, "caption", "") or text
                name = getattr(media, "fileName", "") if what == "document" else ""
                context = media.contextInfo
                break
        else:
            if not text and not body.HasField("extendedTextMessage"):
                kind = info.Type or "unknown"
        mentions = list(context.mentionedJID) if context is not None else []
        return LinkedMessage(
            id=info.ID, chat=chat, sender=sender_jid.User, text=text, sender_name=info.Pushname,
            timestamp=float(info.Timestamp or 0), group=src.IsGroup, from_me=src.IsFromMe,
            mentions_me=bool(self.me) and any(j.split("@")[0] == self.me for j in mentions),
            reply_to=context.stanzaID if context is not None else "", kind=kind, file_name=name,
        )

    # ------------------------------------------------------------ actions

    def _jid(self, chat: str):
        from neonize.utils.jid import build_jid

        user, server = jid_user(chat)
        return build_jid(user, server)

    def _ready(self):
        if self.client is None or self.task is None or self.task.done():
            raise SendError(SendKind.NOT_CONNECTED, "the client is not running")
        return self.client

    async def send_text(self, chat: str, text: str, reply_to: str = "") -> str:
        client = self._ready()
        try:
            answer = await client.send_message(self._jid(chat), text)
        except Exception as exc:
            raise _send_error(exc) from None
        await self._save()  # encrypting for the recipient advanced the keys
        return answer.ID

    async def send_file(self, chat: str, path: Path, caption: str = "") -> str:
        client = self._ready()
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        try:
            if mime in IMAGE_TYPES and path.stat().st_size <= IMAGE_MAX:
                answer = await client.send_image(self._jid(chat), str(path), caption=caption or None)
            else:
                answer = await client.send_document(self._jid(chat), str(path), caption=caption or None,
                                                    filename=path.name, mimetype=mime)
        except Exception as exc:
            raise _send_error(exc) from None
        await self._save()
        return answer.ID

    async def mark_read(self, chat: str, sender: str, ids: list[str]) -> None:
        from neonize.utils.enum import ReceiptType

        client = self._ready()
        await client.mark_read(*ids, chat=self._jid(chat), sender=self._jid(sender or chat), receipt=ReceiptType.READ)

    async def typing(self, chat: str, on: bool) -> None:
        from neonize.utils.enum import ChatPresence, ChatPresenceMedia

        client = self._ready()
        state = ChatPresence.CHAT_PRESENCE_COMPOSING if on else ChatPresence.CHAT_PRESENCE_PAUSED
        await client.send_chat_presence(self._jid(chat), state, ChatPresenceMedia.CHAT_PRESENCE_MEDIA_TEXT)

    async def logout(self) -> None:
        client = self._ready()
        try:
            await client.logout()
        except Exception as exc:
            raise _send_error(exc) from None
