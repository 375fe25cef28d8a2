"""One Telegram bot: receives by long polling or webhook, sends through the outbox, shows "typing".

An update is confirmed to Telegram (the next getUpdates' offset, a webhook's 200) only once the writer
stored it. While the writer's condition lasts (a full disk, a restarting writer) the offset stays where
it is, however long: Telegram keeps unconfirmed updates for 24 hours, so this gateway needs no spool
of its own (services/gateway/spool.py). Only an update refused for itself, or a batch failing for a
reason of its own BATCH_TRIES times, is passed over, kept whole as a dead letter.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections import defaultdict
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import aiohttp

from common import chat_commands, holding
from common.errors import StarlingError
from common.log import register_secret
from common.secrets import resolve_secret
from schema import messages as m
from services.gateway.channel import Channel, FileRef
from services.gateway.telegram import inbound
from services.gateway.telegram.api import ApiError, BotApi, NetworkError
from services.gateway.telegram.outbound import Sender, chat_params
from services.gateway.webhook import answer_after_ack

if TYPE_CHECKING:
    from aiohttp import web

POLL_TIMEOUT_S = 25          # getUpdates long-poll; an update arriving ends it at once
BATCH_TRIES = 5              # a batch failing for a reason of its own (never the writer's condition): then dead letters
ALERT_WITHIN_S = 5.0         # an alert not queued by then is logged, never waited for longer
HOLD_S = 1.0                 # while the writer's condition lasts, the batch is tried again this often
WEBHOOK_ACK_S = 20.0         # a webhook request waits this long for the writer's ack, then asks for a retry
FETCH_WEBHOOK_S = 12.0       # in webhook mode a slow file is described, not waited for (the ack must come first)
CONFLICT_RETRY_S = (2.0, 60.0)
ALLOWED_UPDATES = list(inbound.HANDLED)
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
COMMANDS = chat_commands.menu()


class TelegramChannel(Channel):
    platform = "telegram"
    event_name = "update"

    def __init__(self, gateway, cfg) -> None:
        super().__init__(gateway, cfg)
        self.session: aiohttp.ClientSession | None = None
        self.api: BotApi | None = None
        self.sender: Sender | None = None
        self.me: inbound.Me | None = None
        self.secret = ""
        self.offset: int | None = None
        self.failures = 0

    # ------------------------------------------------------------ start

    def register_webhooks(self) -> None:
        if self.cfg.mode == "webhook":
            path = urlsplit(self.cfg.public_url).path or "/"
            self.gateway.webhooks.route(self.cfg.listen, "POST", path, self.on_webhook,
                                        owner=f"gateways.telegram {self.id!r}")

    async def start(self) -> None:
        paths = self.gateway.paths
        token = resolve_secret(self.cfg.token, paths.secrets_file, key=f"gateways.telegram[{self.id}].token")
        register_secret(token)
        if self.cfg.mode == "webhook":
            self.secret = resolve_secret(self.cfg.secret_token, paths.secrets_file,
                                         key=f"gateways.telegram[{self.id}].secret_token")
            register_secret(self.secret)
        if self.session is None:
            self.session = aiohttp.ClientSession()
        self.api = BotApi(self.cfg.api_base, token, self.session)
        self.sender = Sender(self.api, self.log)
        try:
            me = await self.api.call("getMe")
            self.me = inbound.Me(int(me["id"]), str(me.get("username") or ""))
            if self.cfg.mode == "webhook":
                # one connection: Telegram posts the next update only once this one is answered, so a
                # chat's messages are stored in order (a retried update comes before later ones)
                await self.api.call("setWebhook", {"url": self.cfg.public_url, "secret_token": self.secret,
                                                   "allowed_updates": ALLOWED_UPDATES, "max_connections": 1})
            else:  # getUpdates is refused (409) while a webhook is set: polling mode clears it
                await self.api.call("deleteWebhook", {"drop_pending_updates": False})
        except (ApiError, NetworkError, KeyError, TypeError, ValueError) as exc:
            hint = " (check the bot token's secret)" if isinstance(exc, ApiError) and exc.code in (401, 404) else ""
            raise StarlingError(f"Telegram at {self.cfg.api_base}: {exc}{hint}") from None
        try:
            await self.api.call("setMyCommands", {"commands": COMMANDS})
        except (ApiError, NetworkError) as exc:  # a nicety: the command menu in Telegram's apps
            self.log.info("set_commands_failed", error=str(exc))
        self.status = f"{'polling' if self.cfg.mode == 'polling' else 'webhook'} as @{self.me.username}"
        self.log.info("telegram_ready", mode=self.cfg.mode, bot=self.me.username, bot_id=self.me.id)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    # ------------------------------------------------------------ receive

    async def receive(self) -> None:
        if self.cfg.mode == "webhook":
            await asyncio.Event().wait()  # updates come to on_webhook
        try:
            await self._poll()
        finally:
            if self.offset is not None:  # confirm what was handled, so a restart gets fewer redeliveries
                try:
                    await asyncio.wait_for(self.api.call("getUpdates", {"offset": self.offset, "timeout": 0,
                                                                        "limit": 1}), 2.0)
                except (StarlingError, asyncio.TimeoutError):
                    pass

    async def _poll(self) -> None:
        delay = CONFLICT_RETRY_S[0]
        while True:
            params = {"timeout": POLL_TIMEOUT_S, "allowed_updates": ALLOWED_UPDATES}
            if self.offset is not None:
                params["offset"] = self.offset
            try:
                updates = await self.api.call("getUpdates", params, timeout=POLL_TIMEOUT_S + 10)
            except ApiError as exc:
                if exc.code == 409:
                    self.log.error("telegram_conflict", error=exc.description, retry_in_s=delay,
                                   hint="another process polls this bot token (or a webhook is set): run one"
                                        " poller per token")
                else:
                    self.log.warning("get_updates_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, CONFLICT_RETRY_S[1])
                continue
            except NetworkError as exc:
                self.log.warning("get_updates_failed", error=str(exc), retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, CONFLICT_RETRY_S[1])
                continue
            delay = CONFLICT_RETRY_S[0]
            if not isinstance(updates, list):
                self.log.warning("get_updates_malformed", got=type(updates).__name__)
                continue
            try:
                await self.handle_batch(updates)
            except Exception as exc:
                if holding.condition(exc):  # the writer's: keep the offset, however long (nothing is lost)
                    self.log.warning("inbound_not_acked", error=str(exc) or type(exc).__name__, updates=len(updates))
                    await asyncio.sleep(HOLD_S)
                    continue
                self.failures += 1  # a bug on an update: retried a few times
                if self.failures < BATCH_TRIES:
                    self.log.warning("inbound_failed", error=repr(exc), attempt=self.failures, retry_in_s=self.failures)
                    await asyncio.sleep(self.failures)
                    continue
                # then kept whole as dead letters and passed over, loudly: one poisoned update must not
                # stop the bot for every chat (those of the batch already stored are kept once more)
                if not await self._dead_letter_batch(updates, exc):
                    continue
            self.failures = 0
            ids = [u["update_id"] for u in updates if isinstance(u, dict) and isinstance(u.get("update_id"), int)]
            if ids:
                if self.offset is not None and min(ids) > self.offset:
                    await self._updates_lost(self.offset, min(ids))
                self.offset = max(ids) + 1  # confirmed on the next getUpdates: only acked updates are passed

    async def _updates_lost(self, expected: int, got: int) -> None:
        """Telegram's update ids go up one by one, so a batch starting past the offset we hold means the
        updates between are gone: Telegram keeps one 24 hours, and this gateway was away (unable to poll)
        longer. Nothing can bring them back; the operator hears of it."""
        lost = got - expected
        self.log.error("updates_lost", expected_update_id=expected, first_update_id=got, lost=lost,
                       hint="Telegram keeps an update 24 hours: this gateway could not poll for longer")
        target = self.gateway.svc.cfg.health.alert_to
        if not target:
            return
        instance, _, chat = target.partition(":")
        text = (f"Telegram bot {self.id}: {lost} update(s) were gone before Starling could fetch them (update ids"
                f" {expected} to {got - 1}). Telegram keeps an update for 24 hours, and this gateway could not"
                " poll for longer: messages sent meanwhile were not received.")
        try:
            await asyncio.wait_for(self.gateway.call(m.EnqueueOutbox(
                instance=instance, chat=chat, replies=[m.Reply(text=text)], alert=True)), ALERT_WITHIN_S)
        except (StarlingError, asyncio.TimeoutError) as exc:
            self.log.warning("alert_not_queued", alert_to=target, error=str(exc) or type(exc).__name__)

    async def _dead_letter_batch(self, updates: list, exc: Exception) -> bool:
        """Keep every update of the batch as a dead letter; False when they could not be kept (held)."""
        try:
            for update in updates:
                uid = update.get("update_id") if isinstance(update, dict) else None
                await self.gateway.dead_letters.keep(self, f"tg:{self.id}:u:{uid}" if uid is not None else "",
                                                     update, f"{type(exc).__name__}: {exc}")
        except OSError:  # neither the writer nor the file took them: the offset stays
            await asyncio.sleep(HOLD_S)
            return False
        self.log.error("updates_dead_lettered", error=repr(exc), tries=self.failures,
                       update_ids=[u.get("update_id") for u in updates if isinstance(u, dict)])
        return True

    async def handle_batch(self, updates: list) -> None:
        """Each chat's updates in order, chats side by side; raises if the writer did not ack one."""
        by_chat: dict[object, list] = defaultdict(list)
        for update in updates:
            by_chat[_chat_of(update)].append(update)

        async def in_order(batch: list) -> None:
            for update in batch:
                await self.handle_update(update)

        results = await asyncio.gather(*(in_order(b) for b in by_chat.values()), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def handle_update(self, update: object) -> str:
        """One update to the writer (Gateway.take), held while the writer's condition lasts. A malformed or
        unhandled one is logged and skipped (never a stuck offset)."""
        return await self.gateway.take(self, update)

    # ------------------------------------------------------------ inbound, for the kit

    def parse(self, event: object):
        return inbound.parse(event, self.me, self.id)

    async def download(self, ref: FileRef):
        info = await self.api.call("getFile", {"file_id": ref.ref})
        return self.api.download(str(info["file_path"]))

    def fetch_budget_s(self) -> float:
        return FETCH_WEBHOOK_S if self.cfg.mode == "webhook" else 120.0

    async def on_webhook(self, request: web.Request) -> web.Response:
        """A POST from Telegram: the secret header checked in constant time; 200 only once the writer acked."""
        from aiohttp import web  # here, not at the top: a polling gateway never loads aiohttp.web (~2 MB)

        given = request.headers.get(SECRET_HEADER, "")
        if not self.secret or not hmac.compare_digest(given.encode(), self.secret.encode()):
            self.log.warning("webhook_refused", reason="wrong or missing secret token", peer=request.remote)
            return web.Response(status=401)
        try:
            update = json.loads(await self.gateway.webhooks.read_body(request, verified=True))
        except (ValueError, RecursionError):
            self.log.warning("update_skipped", reason="body is not JSON")
            return web.Response(status=200)  # a redelivery would be the same garbage
        return await answer_after_ack(self.handle_update(update), WEBHOOK_ACK_S, self.log)

    # ------------------------------------------------------------ send

    def outbound(self) -> Sender | None:
        return self.sender

    async def typing(self, chat: str, platform_msg_id: str) -> None:
        # best effort: never spend the bot's message budget on a sign (replies first)
        if self.api is not None and self.sender.bot.delay() == 0:
            base, _, topic = chat.partition(":")
            params = {**chat_params(self.sender.moved.get(base, base), topic), "action": "typing"}
            await self.api.call("sendChatAction", params, timeout=10)


def _chat_of(update: object) -> object:
    if isinstance(update, dict):
        for value in update.values():
            if isinstance(value, dict) and isinstance(value.get("chat"), dict):
                return value["chat"].get("id")
    return None
