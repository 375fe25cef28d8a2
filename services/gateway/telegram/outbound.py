"""Telegram's half of the outbound path (the kit's services/gateway/delivery.py owns the rest): HTML parts
of 4,096 UTF-16 units, files with their captions, Telegram's pace, the Bot API's errors mapped to outcomes
(429 waits on that chat alone, 403 fails for good, a migrated group is followed), and drafts: a
sendMessageDraft preview in a private chat, one placeholder message edited in a group."""

from __future__ import annotations

import time
from pathlib import Path

from schema import messages as m
from services.gateway.channel import Failed, Outcome, Retry
from services.gateway.delivery import Outbound, backoff
from services.gateway.limits import Bucket, Windows
from services.gateway.telegram.api import ApiError, BotApi
from services.gateway.markup.split import utf16_len
from services.gateway.telegram.render import split_html, to_html, to_plain

PHOTO_TYPES = (".jpg", ".jpeg", ".png", ".webp")
DRAFT_RESERVE = 5  # a group's pace keeps this many sends for answers: a draft never takes the last ones
PHOTO_MAX = 10 * 1024 * 1024     # sendPhoto's limit
DOCUMENT_MAX = 50 * 1024 * 1024  # sendDocument's limit for bots
CAPTION_MAX = 1024
TOKEN_REJECTED_RETRY_S = 300.0
NOT_MODIFIED = "message is not modified"


class Sender(Outbound):
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

    platform = "Telegram"
    caption_max = CAPTION_MAX
    file_max = DOCUMENT_MAX
    measure = staticmethod(utf16_len)

    def render(self, body: str) -> list[str]:
        return split_html(to_html(body))

    def _chat(self, item_chat: str) -> tuple[str, str]:
        base, _, topic = item_chat.partition(":")  # "<chat id>:<topic id>" in a forum supergroup
        return self.moved.get(base, base), topic

    async def _followed(self, item_chat: str, call):
        """``call(chat)``, once more in the supergroup a group became (migrate_to_chat_id)."""
        chat, _ = self._chat(item_chat)
        try:
            return await call(chat)
        except ApiError as exc:
            if not exc.migrate_to:
                raise
            self.log.info("chat_migrated", chat=chat, to=exc.migrate_to)
            self.moved[item_chat.partition(":")[0]] = str(exc.migrate_to)
            return await call(str(exc.migrate_to))

    async def send_text(self, item: m.OutboxItem, index: int, text: str, last: bool) -> str:
        # in a group an answer quotes the message it answers; in a private chat that is only noise
        _, topic = self._chat(item.chat)
        return await self._followed(item.chat, lambda chat: self._send_part(
            chat, "html", text, item.reply_to if index == 0 and chat.startswith("-") else "", topic))

    async def send_file(self, item: m.OutboxItem, path: Path, caption: str) -> str:
        _, topic = self._chat(item.chat)
        return await self._followed(item.chat, lambda chat: self._send_part(
            chat, "file", caption, item.reply_to if chat.startswith("-") else "", topic, path))

    async def edit_text(self, item: m.OutboxItem, message_id: str, text: str, last: bool) -> str:
        chat, _ = self._chat(item.chat)
        await self._pace(chat)
        await self._edit(chat, message_id, text)
        return message_id

    async def drop_placeholder(self, item: m.OutboxItem, message_id: str) -> None:
        chat, _ = self._chat(item.chat)
        await self.api.call("deleteMessage", {"chat_id": chat_param(chat), "message_id": int(message_id)}, timeout=10)

    # ------------------------------------------------------------ drafts

    def draft_kind(self, chat: str) -> str:
        return "placeholder" if self._chat(chat)[0].startswith("-") else "preview"

    def draft_room(self, chat: str, placeholder: str = "") -> bool:
        """A draft goes only when no answer would wait for it: the bot's pace free, a group's with room."""
        chat, _ = self._chat(chat)
        if self.bot.delay() > 0 or self.per_chat[chat].delay() > 0:
            return False
        if chat.startswith("-"):
            group = self.per_group[chat]
            return group.delay() == 0 and group.limit - _level(group) > DRAFT_RESERVE
        return True

    async def show_draft(self, chat_key: str, draft_id: int, text: str, placeholder: str, reply_to: str) -> str:
        """One draft: a preview in a private chat (sendMessageDraft; "" back), else the placeholder posted
        or edited (its message id back). A text Telegram will not parse goes as plain text."""
        chat, topic = self._chat(chat_key)
        await self._pace(chat)
        params = chat_params(chat, topic)
        if not chat.startswith("-"):
            await self._html_or_plain("sendMessageDraft", {**params, "draft_id": draft_id}, text)
            return ""
        if placeholder:
            await self._edit(chat, placeholder, text)
            return placeholder
        if reply_to.isdigit():
            params["reply_parameters"] = {"message_id": int(reply_to), "allow_sending_without_reply": True}
        sent = await self._html_or_plain("sendMessage", {**params, "link_preview_options": {"is_disabled": True}},
                                         text)
        return _message_id(sent)

    def draft_wait(self, exc: Exception) -> float | None:
        """Seconds a draft error asks to wait (429), None when drafts of this answer should stop."""
        if isinstance(exc, ApiError) and exc.code == 429:
            return exc.retry_after or 1.0
        return None

    async def _edit(self, chat: str, message_id: str, text: str) -> None:
        try:
            await self._html_or_plain("editMessageText", {"chat_id": chat_param(chat), "message_id": int(message_id),
                                                          "link_preview_options": {"is_disabled": True}}, text)
        except ApiError as exc:
            if exc.code == 400 and NOT_MODIFIED in exc.description.lower():
                return  # it already says this (a draft showed the whole answer, or an edit repeated)
            raise

    async def _html_or_plain(self, method: str, params: dict, text: str):
        try:
            return await self.api.call(method, {**params, "text": text, "parse_mode": "HTML"})
        except ApiError as exc:
            if not exc.bad_entities:
                raise
            self.log.warning("entities_rejected", method=method, error=exc.description, fallback="plain text")
            return await self.api.call(method, {**params, "text": to_plain(text)})

    async def _pace(self, chat: str) -> None:
        await self.per_chat[chat].wait()
        if chat.startswith("-"):
            await self.per_group[chat].wait()
        await self.bot.wait()

    async def _send_part(self, chat: str, kind: str, text: str, reply_to: str, topic: str = "",
                         path: Path = Path()) -> str:
        await self._pace(chat)
        params = chat_params(chat, topic)
        if reply_to.isdigit():
            params["reply_parameters"] = {"message_id": int(reply_to), "allow_sending_without_reply": True}
        if kind == "file":
            return await self._send_file(chat, params, text, path)
        sent = await self._html_or_plain("sendMessage", {**params, "link_preview_options": {"is_disabled": True}},
                                         text)
        return _message_id(sent)

    async def _send_file(self, chat: str, params: dict, caption: str, path: Path) -> str:
        photo = path.suffix.lower() in PHOTO_TYPES and path.stat().st_size <= PHOTO_MAX
        method, field = ("sendPhoto", "photo") if photo else ("sendDocument", "document")
        if caption:
            params = {**params, "caption": caption, "parse_mode": "HTML"}
        try:
            sent = await self.api.upload(method, params, field, path)
        except ApiError as exc:
            if not exc.bad_entities:
                raise
            self.log.warning("entities_rejected", chat=chat, error=exc.description, fallback="plain caption")
            params = {k: v for k, v in params.items() if k != "parse_mode"}
            sent = await self.api.upload(method, {**params, "caption": to_plain(caption)}, field, path)
        return _message_id(sent)

    async def outcome(self, exc: Exception, item: m.OutboxItem) -> Outcome | None:
        if not isinstance(exc, ApiError):
            return None
        attempt = item.attempt
        if exc.code == 429:
            after = exc.retry_after or 1.0
            self.per_chat[self._chat(item.chat)[0]].cool_down(after)
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


def chat_params(chat: str, topic: str) -> dict:
    """The parameters that address a chat, and its forum topic where `topic` is one."""
    params: dict = {"chat_id": chat_param(chat)}
    if topic.isdigit():
        params["message_thread_id"] = int(topic)
    return params


def _level(bucket: Bucket) -> float:
    """How full a leaky bucket is now (its ``limit`` is full)."""
    return max(0.0, bucket.level - (time.monotonic() - bucket.at) * bucket.rate)
