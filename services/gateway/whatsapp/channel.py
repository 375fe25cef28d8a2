"""One WhatsApp number on the Cloud API: a webhook (GET verification, signed POSTs) in, the Graph API
out, and a read receipt with a typing indicator while the agent works. In linked-device mode a LinkedTransport
(linked_transport.py) drives the client; its messages go through the kit's ``take`` like the webhook's, and
its rows through the kit's delivery with its own Outbound."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time

import aiohttp
from aiohttp import web

from common.log import register_secret
from common.secrets import resolve_secret
from schema import messages as m
from services.gateway import attachments
from services.gateway.channel import Channel, FileRef, InboundMessage
from services.gateway.delivery import Outbound
from services.gateway.order import Window
from services.gateway.webhook import answer_after_ack
from services.gateway.whatsapp import inbound, linked
from services.gateway.whatsapp.api import GraphApi, GraphError, NetworkError
from services.gateway.whatsapp.linked_transport import LinkedTransport
from services.gateway.whatsapp.outbound import Sender

ACK_WITHIN_S = 15.0        # Meta retries a webhook that is not answered 200 in time
FETCH_WITHIN_S = 10.0      # a slow media file is described, not waited for (the 200 must come first)
TYPING_EVERY_S = 20.0      # WhatsApp shows the indicator for 25 s or until the reply
# Meta posts webhooks concurrently and retries each on its own, so one chat's messages can come the wrong
# way round: they are stored in the order of their timestamps (whole seconds; ties: arrival), a message
# waiting until skew_s past the start of its timestamp's second (a late one, late_hold_s after it came;
# at most max_hold_s) for one sent before it (the kit's
# services/gateway/order.py says how, and why there rather than in the writer's claim)
REORDER = Window(skew_s=0.15, max_hold_s=2.0, late_hold_s=0.5)


class WhatsAppChannel(Channel):
    platform = "whatsapp"

    def __init__(self, gateway, cfg, make_client=None) -> None:
        super().__init__(gateway, cfg)
        self.make_client = make_client  # linked mode's client: neonize unless a test passes its own
        self.session: aiohttp.ClientSession | None = None
        self.api: GraphApi | None = None
        self.sender: Sender | None = None
        self.app_secret = ""
        self.verify_token = ""
        self.typed: dict[str, float] = {}
        self.linked: LinkedTransport | None = None  # mode = "linked"
        self.reorder = REORDER if cfg.mode == "cloud" else None  # a linked device's events come in order
        self.tasks: set[asyncio.Task] = set()

    @staticmethod
    def normalize_id(value: str) -> str:
        return "".join(ch for ch in str(value) if ch.isdigit())  # "+49 151-234" -> "49151234", as wa_id spells it

    @property
    def path(self) -> str:
        return f"/whatsapp/{self.id}/webhook"

    def register_webhooks(self) -> None:
        if self.cfg.mode != "cloud":
            return
        owner = f"gateways.whatsapp {self.id!r}"
        self.gateway.webhooks.route(self.cfg.listen, "GET", self.path, self.on_verify, owner=owner)
        self.gateway.webhooks.route(self.cfg.listen, "POST", self.path, self.on_post, owner=owner)

    async def start(self) -> None:
        if self.cfg.mode == "linked":
            self.linked = self.linked or LinkedTransport(self, make_client=self.make_client)
            return await self.linked.start()
        paths, key = self.gateway.paths, f"gateways.whatsapp[{self.id}]"
        token = resolve_secret(self.cfg.access_token, paths.secrets_file, key=f"{key}.access_token")
        self.app_secret = resolve_secret(self.cfg.app_secret, paths.secrets_file, key=f"{key}.app_secret")
        self.verify_token = resolve_secret(self.cfg.verify_token, paths.secrets_file, key=f"{key}.verify_token")
        for value in (token, self.app_secret, self.verify_token):
            register_secret(value)
        if self.session is None:
            self.session = aiohttp.ClientSession()
        self.api = GraphApi(self.cfg.api_base, token, self.cfg.phone_number_id, self.session)
        self.sender = Sender(self.api, self.log, self.cfg.template, self.cfg.template_language)
        self.status = f"cloud: webhook on {self.cfg.listen}{self.path}"
        self.log.info("whatsapp_ready", mode="cloud", number=self.cfg.phone_number_id)

    async def close(self) -> None:
        if self.linked is not None:
            await self.linked.close()
        if self.session is not None:
            await self.session.close()

    async def receive(self) -> None:
        if self.linked is not None:
            return await self.linked.run()
        await asyncio.Event().wait()  # the Cloud API posts to on_post

    # ------------------------------------------------------------ webhook

    async def on_verify(self, request: web.Request) -> web.Response:
        """Meta's subscription check: echo hub.challenge when hub.verify_token matches."""
        q = request.query
        token = q.get("hub.verify_token", "")
        if (q.get("hub.mode") == "subscribe" and self.verify_token
                and hmac.compare_digest(token.encode(), self.verify_token.encode())):
            return web.Response(text=q.get("hub.challenge", ""))
        self.log.warning("verify_refused", reason="wrong verify token or mode", peer=request.remote)
        return web.Response(status=403)

    def signed(self, raw: bytes, header: str) -> bool:
        if not self.app_secret or not header.startswith("sha256="):
            return False
        expected = hmac.new(self.app_secret.encode(), raw, hashlib.sha256).hexdigest()
        if not header.isascii():  # a forged header may hold anything: refused, never a 500
            return False
        return hmac.compare_digest(expected.encode(), header[len("sha256="):].encode())

    async def on_post(self, request: web.Request) -> web.Response:
        raw = await self.gateway.webhooks.read_body(request)  # bounded: size, time, unverified at once
        if not self.signed(raw, request.headers.get("X-Hub-Signature-256", "")):
            self.log.warning("webhook_refused", reason="bad or missing X-Hub-Signature-256", peer=request.remote)
            return web.Response(status=401)  # checked before anything is parsed or stored
        try:
            payload = json.loads(raw)
        except (ValueError, RecursionError):
            self.log.warning("event_skipped", reason="body is not JSON")
            return web.Response(status=200)  # a redelivery would be the same garbage
        return await answer_after_ack(self.handle(payload), ACK_WITHIN_S, self.log)

    async def handle(self, payload: object) -> list[str]:
        found = inbound.values(payload, self.cfg.phone_number_id)
        if isinstance(found, inbound.Skip):
            self.log.info("event_skipped", reason=found.reason)
            return []
        outcomes = []
        for value in found:
            if "_other_number" in value:  # a second number posting to this URL is configured nowhere here
                self.log.warning("event_for_another_number", phone_number_id=value["_other_number"],
                                 hint="give each number its own [[gateways.whatsapp]] and webhook URL")
                continue
            # side by side: one chat's messages wait for each other in the kit (services/gateway/order.py)
            results = await asyncio.gather(*(self.gateway.take(self, event) for event in inbound.messages(value)),
                                           return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException):
                    raise result
            outcomes += results
            for status in inbound.statuses(value):
                if isinstance(status, inbound.Skip):
                    self.log.info("status_skipped", reason=status.reason)
                    continue
                await self.gateway.call(m.RecordDelivery(instance=self.id, platform_msg_id=status.wamid,
                                                         status=status.status, error=status.error))
                self.log.info("delivery", platform_msg_id=status.wamid, status=status.status, error=status.error)
        return outcomes

    # ------------------------------------------------------------ inbound, for the kit

    def parse(self, event: object):
        return linked.parse(event, self.id) if self.cfg.mode == "linked" else inbound.parse(event, self.id)

    async def download(self, ref: FileRef):
        if self.linked is not None:
            return await self.linked.download(ref)
        media = await self.api.media(ref.ref)  # a short-lived URL and the file's size
        size, cap = int(media.get("file_size") or 0), int(self.cfg.max_attachment_mb * 1024 * 1024)
        if size > cap:
            raise attachments.TooLarge(size, cap)
        return self.api.download(str(media["url"]))

    def fetch_budget_s(self) -> float:
        return FETCH_WITHIN_S if self.linked is None else super().fetch_budget_s()  # linked: no webhook to answer

    def stored(self, msg: InboundMessage) -> None:
        if self.linked is None:  # blue ticks at once; the typing indicator follows if the agent is slow
            task = asyncio.create_task(self._mark_read(msg.platform_msg_id))
            self.tasks.add(task)  # the loop holds tasks weakly: keep each until it is done
            task.add_done_callback(self.tasks.discard)

    # ------------------------------------------------------------ send

    def outbound(self) -> Outbound | None:
        return self.linked.outbound if self.linked is not None else self.sender

    async def typing(self, chat: str, platform_msg_id: str) -> None:
        """A read receipt and the typing indicator (refreshed before its 25 s run out)."""
        if self.linked is not None:
            return await self.linked.typing(chat, platform_msg_id)
        if self.api is None or not platform_msg_id:
            return
        if time.monotonic() - self.typed.get(platform_msg_id, -TYPING_EVERY_S) < TYPING_EVERY_S:
            return
        self.typed[platform_msg_id] = time.monotonic()
        await self.api.send({"status": "read", "message_id": platform_msg_id, "typing_indicator": {"type": "text"}})

    async def _mark_read(self, wamid: str) -> None:
        try:
            await self.api.send({"status": "read", "message_id": wamid})
        except (GraphError, NetworkError) as exc:
            self.log.info("read_receipt_failed", platform_msg_id=wamid, error=str(exc))

    async def typing_done(self, chat: str, platform_msg_id: str) -> None:
        if self.linked is not None:
            return await self.linked.typing_done(chat, platform_msg_id)
        self.typed.pop(platform_msg_id, None)
