"""Sending an outbox row through the Cloud API: WhatsApp markup in parts of 4,096 characters, files
by upload, and the error codes mapped to outcomes: outside the 24-hour window a template (or a clear
failure), rate limits backed off per number and per recipient, other codes recorded with their meaning."""

from __future__ import annotations

import mimetypes
import time
from pathlib import Path

from schema import messages as m
from services.gateway.channel import Failed, Outcome, Retry
from services.gateway.delivery import Outbound, backoff
from services.gateway.limits import Window, Windows
from services.gateway.whatsapp.api import GraphApi, GraphError
from services.gateway.whatsapp.render import split_whatsapp, to_whatsapp

IMAGE_TYPES = ("image/jpeg", "image/png")
IMAGE_MAX = 5 * 1024 * 1024
DOCUMENT_MAX = 100 * 1024 * 1024
CAPTION_MAX = 1024
OUTSIDE_WINDOW = 131047
NUMBER_RATE = 130429      # the number's throughput
PAIR_RATE = 131056        # too many messages to one recipient
TOKEN = 190
TRANSIENT = {1, 2, 131000, 131016, 133004}
APP_RATE = {4, 80007}     # the app's / the business account's call limits: they reset within the hour
APP_RATE_RETRY_S = 300.0
TEMPLATE_EVERY_S = 86400.0  # one template per recipient a day: more rows outside the window do not repeat it
TOKEN_RETRY_S = 300.0
MEANINGS = {
    100: "invalid parameter", 131009: "a parameter value is not valid", 131021: "the recipient is the sender",
    131026: "message undeliverable (no WhatsApp account, old app, or the terms not accepted)",
    131031: "the business account is locked", 131042: "a payment problem on the business account",
    131045: "the phone number is not registered", 131051: "unsupported message type",
    131052: "media download error", 131053: "media upload error", 132000: "template parameters do not match",
    132001: "the template does not exist", 368: "temporarily blocked for policy violations",
}


class Markup(Outbound):
    """WhatsApp's renderer and limits, shared by the Cloud API's sender and the linked device's Outbound."""

    platform = "WhatsApp"
    caption_max = CAPTION_MAX
    file_max = DOCUMENT_MAX

    def render(self, body: str) -> list[str]:
        return split_whatsapp(to_whatsapp(body))


class Sender(Markup):
    """Pacing: the Cloud API's default 80 messages a second per number; after a pair-rate error
    (131056) the recipient waits alone, after a throughput error (130429) the whole number.
    No drafts: the Cloud API has the typing indicator only (services/gateway/typing_sign.py)."""

    def __init__(self, api: GraphApi, log, template: str = "", template_language: str = "en_US") -> None:
        self.api = api
        self.log = log
        self.number = Window(80, 1.0)
        self.recipients = Windows(20, 1.0)
        self.template = template
        self.template_language = template_language
        self.templated: dict[str, float] = {}  # recipient -> when a template went (this process)

    async def send_text(self, item: m.OutboxItem, index: int, text: str, last: bool) -> str:
        return await self._send_part(item.chat, "text", text, Path())

    async def send_file(self, item: m.OutboxItem, path: Path, caption: str) -> str:
        return await self._send_part(item.chat, "file", caption, path)

    async def _send_part(self, to: str, kind: str, text: str, path: Path) -> str:
        await self.recipients[to].wait()
        await self.number.wait()
        if kind == "text":
            payload = {"recipient_type": "individual", "to": to, "type": "text",
                       "text": {"body": text, "preview_url": False}}
        else:
            mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            image = mime in IMAGE_TYPES and path.stat().st_size <= IMAGE_MAX
            media_id = await self.api.upload(path, mime)
            media: dict = {"id": media_id} if image else {"id": media_id, "filename": path.name}
            if text:
                media["caption"] = text
            kind = "image" if image else "document"
            payload = {"recipient_type": "individual", "to": to, "type": kind, kind: media}
        answer = await self.api.send(payload)
        sent = answer.get("messages") if isinstance(answer.get("messages"), list) else []
        return str(sent[0].get("id") or "") if sent and isinstance(sent[0], dict) else ""

    async def outcome(self, exc: Exception, item: m.OutboxItem) -> Outcome | None:
        return await self._outcome(item.chat, exc, item.attempt) if isinstance(exc, GraphError) else None

    async def _outcome(self, to: str, exc: GraphError, attempt: int) -> Outcome:
        if exc.code == OUTSIDE_WINDOW:
            if not self.template:
                return Failed(f"{exc.code} outside the 24-hour window: the person must write first"
                              " (or set a template for this gateway)")
            if time.monotonic() - self.templated.get(to, -TEMPLATE_EVERY_S) < TEMPLATE_EVERY_S:
                return Failed(f"{exc.code} outside the 24-hour window; template {self.template!r} was already sent")
            self.templated[to] = time.monotonic()
            try:
                await self.api.send({"recipient_type": "individual", "to": to, "type": "template", "template": {
                    "name": self.template, "language": {"code": self.template_language}}})
            except GraphError as again:
                return Failed(f"{exc.code} outside the 24-hour window; the template failed too: {again}")
            self.log.info("template_sent", to=to, template=self.template)
            return Failed(f"{exc.code} outside the 24-hour window: template {self.template!r} sent instead")
        if exc.code == NUMBER_RATE:
            self.number.cool_down(10.0)
            return Retry(max(10.0, backoff(attempt)), f"{exc.code} rate limit of the number")
        if exc.code == PAIR_RATE:
            self.recipients[to].cool_down(6.0)
            return Retry(max(6.0, backoff(attempt)), f"{exc.code} too many messages to this recipient")
        if exc.code == TOKEN:
            self.log.error("token_rejected", detail="the Graph API refused the access token (190); check the secret")
            return Retry(TOKEN_RETRY_S, str(exc))
        if exc.code in APP_RATE or exc.http == 429:
            self.number.cool_down(min(APP_RATE_RETRY_S, 60.0))
            return Retry(max(APP_RATE_RETRY_S, backoff(attempt)), f"{exc.code} rate limit of the app or account")
        if exc.code in TRANSIENT or exc.http >= 500:
            return Retry(backoff(attempt), str(exc))
        meaning = MEANINGS.get(exc.code, "")
        return Failed(f"{exc.code} {meaning + ': ' if meaning else ''}{exc.message}"
                      + (f" ({exc.details})" if exc.details else ""))
