"""Sending an outbox row to Telegram: formatted and split, paced, with the Bot API's errors mapped to
outcomes (429 waits on that chat alone, 403 fails for good, a migrated group is followed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import NamedTuple

from schema import messages as m
from services.gateway.channel import Failed, Outcome, Progress, Retry, Sent
from services.gateway.delivery import backoff
from services.gateway.limits import Bucket, Windows
from services.gateway.telegram.api import ApiError, BotApi
from services.gateway.markup.split import utf16_len
from services.gateway.telegram.render import split_html, to_html, to_plain

PHOTO_TYPES = (".jpg", ".jpeg", ".png", ".webp")
PHOTO_MAX = 10 * 1024 * 1024     # sendPhoto's limit
DOCUMENT_MAX = 50 * 1024 * 1024  # sendDocument's limit for bots
CAPTION_MAX = 1024
TOKEN_REJECTED_RETRY_S = 300.0
OFF_LOOP_CHARS = 4_000  # longer texts are formatted in a thread, so one big answer never stalls other chats


class Part(NamedTuple):
    kind: str            # html | file
    text: str            # the HTML text, or the file's caption
    path: Path = Path()


class Sender:
    """Limits, from Telegram's bot FAQ: about one message a second per chat, 20 a minute per group,
    30 a second per bot. Chats wait on their own windows, so one slow chat holds up no other."""

    def __init__(self, api: BotApi, log) -> None:
        self.api = api
        self.log = log
        # as python-telegram-bot's AIORateLimiter: 30 a second per bot and 20 a minute per group, bursts
        # allowed within each; a private chat has no pace of its own, its window only holds a 429's cooldown
        self.per_chat = Windows(30, 1.0)
        self.per_group = Windows(20, 60.0, kind=Bucket)  # its leaky buckets: a burst of 20, then one every 3 s
        self.bot = Bucket(30, 1.0)  # a burst of 30, then one every 1/30 s
        self.moved: dict[str, str] = {}  # group chat id -> its supergroup's (migrate_to_chat_id)

    async def send(self, item: m.OutboxItem, progress: Progress) -> Outcome:
        base, _, topic = item.chat.partition(":")  # "<chat id>:<topic id>" in a forum supergroup
        chat = self.moved.get(base, base)
        parts = self._parts(item) if len(item.body) < OFF_LOOP_CHARS else await asyncio.to_thread(self._parts, item)
        if isinstance(parts, Failed):
            return parts
        if not parts:
            self.log.info("outbox_empty", outbox_id=item.id)
            return Sent("")
        message_id = ""
        for index in range(min(item.parts_sent, len(parts)), len(parts)):
            # in a group an answer quotes the message it answers; in a private chat that is only noise
            reply_to = item.reply_to if index == 0 and chat.startswith("-") else ""
            try:
                message_id = await self._send_part(chat, parts[index], reply_to, topic)
            except ApiError as exc:
                if exc.migrate_to:
                    self.log.info("chat_migrated", chat=chat, to=exc.migrate_to)
                    self.moved[base] = chat = str(exc.migrate_to)
                    try:
                        message_id = await self._send_part(chat, parts[index], reply_to, topic)
                    except ApiError as again:
                        return self._outcome(chat, again, item.attempt)
                else:
                    return self._outcome(chat, exc, item.attempt)
            if index < len(parts) - 1:
                await progress(index + 1, message_id)
        return Sent(message_id)

    def _parts(self, item: m.OutboxItem) -> list[Part] | Failed:
        """Text parts and the file part (with its caption), in sending order."""
        body = item.body.strip()
        texts = [Part("html", p) for p in split_html(to_html(body))] if body else []
        if item.kind != "file":
            return texts
        path = Path(item.file_path)
        if not path.is_file():
            return Failed(f"file not found: {item.file_path}")
        if path.stat().st_size > DOCUMENT_MAX:
            return Failed(f"file too large for Telegram ({path.stat().st_size // 1_048_576} MB, limit 50 MB)")
        caption = to_html(body) if body else ""
        if utf16_len(caption) <= CAPTION_MAX:
            return [Part("file", caption, path)]
        return [Part("file", "", path), *texts]  # a long text goes after the file, in messages of its own

    async def _pace(self, chat: str) -> None:
        await self.per_chat[chat].wait()
        if chat.startswith("-"):
            await self.per_group[chat].wait()
        await self.bot.wait()

    async def _send_part(self, chat: str, part: Part, reply_to: str, topic: str = "") -> str:
        await self._pace(chat)
        params: dict = {"chat_id": chat_param(chat)}
        if topic.isdigit():
            params["message_thread_id"] = int(topic)
        if reply_to.isdigit():
            params["reply_parameters"] = {"message_id": int(reply_to), "allow_sending_without_reply": True}
        if part.kind == "file":
            return await self._send_file(chat, params, part)
        try:
            sent = await self.api.call("sendMessage", {**params, "text": part.text, "parse_mode": "HTML",
                                                       "link_preview_options": {"is_disabled": True}})
        except ApiError as exc:
            if not exc.bad_entities:
                raise
            self.log.warning("entities_rejected", chat=chat, error=exc.description, fallback="plain text")
            sent = await self.api.call("sendMessage", {**params, "text": to_plain(part.text)})
        return _message_id(sent)

    async def _send_file(self, chat: str, params: dict, part: Part) -> str:
        photo = part.path.suffix.lower() in PHOTO_TYPES and part.path.stat().st_size <= PHOTO_MAX
        method, field = ("sendPhoto", "photo") if photo else ("sendDocument", "document")
        if part.text:
            params = {**params, "caption": part.text, "parse_mode": "HTML"}
        try:
            sent = await self.api.upload(method, params, field, part.path)
        except ApiError as exc:
            if not exc.bad_entities:
                raise
            self.log.warning("entities_rejected", chat=chat, error=exc.description, fallback="plain caption")
            params = {k: v for k, v in params.items() if k != "parse_mode"}
            sent = await self.api.upload(method, {**params, "caption": to_plain(part.text)}, field, part.path)
        return _message_id(sent)

    def _outcome(self, chat: str, exc: ApiError, attempt: int) -> Outcome:
        if exc.code == 429:
            after = exc.retry_after or 1.0
            self.per_chat[chat].cool_down(after)
            return Retry(after, exc.description)
        if exc.code == 403:
            return Failed(exc.description or "forbidden: the bot was blocked or removed")
        if exc.code == 401:
            self.log.error("token_rejected", detail="Telegram refused the bot token (401); check the secret")
            return Retry(TOKEN_REJECTED_RETRY_S, exc.description)
        if 400 <= exc.code < 500:
            return Failed(exc.description or f"HTTP {exc.code}")
        return Retry(backoff(attempt), exc.description or f"HTTP {exc.code}")  # 5xx: back off by attempt


def _message_id(sent: object) -> str:
    return str(sent.get("message_id", "")) if isinstance(sent, dict) else ""


def chat_param(chat: str) -> int | str:
    try:
        return int(chat)
    except ValueError:
        return chat  # an @channel username
