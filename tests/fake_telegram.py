"""Fake Telegram Bot API for tests: `/bot<TOKEN>/<method>` and `/file/bot<TOKEN>/<path>` on 127.0.0.1.

One aiohttp app serves several bots (one per token), keeps a per-bot update queue with the real offset
semantics, delivers to a webhook when one is set, records every request and every message the bots sent,
and answers scripted or rule-based errors in the Bot API's own envelope::

    {"ok": true, "result": ...}
    {"ok": false, "error_code": 429, "description": "Too Many Requests: retry after 1",
     "parameters": {"retry_after": 1}}

In a test's event loop::

    async with FakeTelegram() as tg:               # tokens=(DEFAULT_TOKEN,) unless given
        base = tg.url                                # in place of https://api.telegram.org
        tg.message("hi", user=42)                    # a private text message from user 42
        ...                                          # the gateway polls f"{base}/bot{token}/getUpdates"
        tg.sent(chat_id=42)                          # [{"kind": "text", "text": ..., "parse_mode": ...}, ...]

As a process of its own: ``python -m tests.fake_telegram --port-file PATH [--token T ...] [--lifetime S]``
writes the port to PATH once it listens and stops on SIGTERM/SIGINT or after --lifetime seconds;
`FakeTelegramProcess` wraps it for synchronous tests and speaks the control endpoints below.

Bot API behaviour (checked against the Bot API documentation):
  - any method by GET or POST; parameters from the query string, a JSON body, a urlencoded form or a
    multipart form (uploads); method names are case-insensitive; an unknown method is 404 "Not Found";
    an unknown token is 401 "Unauthorized".
  - getUpdates(offset, limit 1..100, timeout): updates with update_id >= offset, at most limit; a call with
    offset N forgets (confirms) every update below N, a negative offset keeps only the last -offset ones;
    with none pending it waits up to timeout s (capped at MAX_POLL_TIMEOUT, fractions allowed for fast
    tests, cut short when the server stops). A second getUpdates for the same bot ends the one in flight
    with 409 "Conflict: terminated by other getUpdates request; ...". With a webhook set it is 409
    "Conflict: can't use getUpdates method while webhook is active; ...".
  - setWebhook(url, secret_token, drop_pending_updates) / deleteWebhook / getWebhookInfo. While a webhook is
    set, queued updates are POSTed to it one at a time in order, JSON, with the header
    X-Telegram-Bot-Api-Secret-Token when a secret is set; a non-2xx answer or a connection error is retried
    with exponential backoff (webhook_backoff=(first, max) s) and the update dropped after
    webhook_attempts tries, like Telegram ("give up after a reasonable number of attempts"). http:// URLs
    are accepted (Telegram wants HTTPS).
  - sendMessage(chat_id, text, parse_mode, reply_to_message_id | reply_parameters): text 1..4096 UTF-16
    units after entity parsing, else 400 "Bad Request: message is too long" / "message text is empty";
    parse_mode=HTML is parsed like Telegram (tags b strong i em u ins s strike del span.tg-spoiler
    tg-spoiler a code pre blockquote tg-emoji, entities &lt; &gt; &amp; &quot; &#N; &#xN;): an unknown or
    unbalanced tag or a bare "<" is 400 "Bad Request: can't parse entities: ..."; other parse modes are
    not checked. A reply to a message the chat never had is 400 "message to be replied not found" unless
    allow_sending_without_reply.
  - sendPhoto / sendDocument / sendVoice (multipart upload, or a known file_id, or an http(s) URL),
    caption <= 1024; sendChatAction(chat_id, action); editMessageText (a message of this bot; the same text
    again is 400 "message is not modified"); sendMessageDraft(chat_id, draft_id, text, parse_mode,
    message_thread_id): private chats only (a group or channel id is 400), draft_id a non-zero integer,
    text 1..4096 after entity parsing, recorded in drafts() and never in sent(); deleteMessage(chat_id,
    message_id) of a message the chat has (else 400 "message to delete not found"); getFile(file_id) ->
    {file_id, file_unique_id, file_size, file_path}, files over 20 MB are 400 "file is too big";
    GET /file/bot<token>/<file_path> the content; getMe. setMyCommands and a few others answer true.

Test-side controls (methods of FakeTelegram; the same over HTTP in both modes):
  message / edited_message / photo / document / voice / inject   queue updates (return the update)
  add_file(content)                 a downloadable file, returns {"file_id", "file_path", ...}
  script_error(method, kind, times=1, chat_id=None, ...)   the next `times` matching calls fail:
      kind "flood" 429 + retry_after | "parse" 400 can't parse entities | "blocked" 403 |
      "migrate" 400 + migrate_to_chat_id | "server" 500 | "chat_not_found" 400 | "conflict" 409 |
      "unauthorized" 401; error_code / description override.
  block(chat_id) / migrate(chat_id, to)   every later send to that chat fails 403 / 400 migrate
  set_rate_limit(min_interval)      a 2nd send to one chat within min_interval s is 429 (None: off)
  requests() / sent() / actions() / drafts() / deleted() / deliveries / pending_updates()   what was
                                    recorded, oldest first (sent() has "edit" records for editMessageText)
  age_updates(seconds)              as if the queued updates had waited that much longer: Telegram drops an
                                    update not handed over within 24 h (UPDATE_TTL_S), so one older is gone
                                    from getUpdates, webhooks and pending_updates(); dropped() lists them
  injected()                        when each update was queued: {"bot", "update_id", "ts"} (time.time(),
                                    the clock of sent()'s "ts": update -> reply latency, measured here)
  sent(since=T) / injected(since=T) only records with ts >= T (a long run reads them as it goes, within
                                    the MAX_RECORDED kept)

Control endpoints (both modes), JSON in and out, `bot` = a bot id or token (default: the first bot):
  GET    /_control/health                       {"ok": true}
  GET    /_control/bots                         [{"id", "username"}]      POST {"token", "username"?}
  POST   /_control/updates                      {"kind": "message"|"edited_message"|"photo"|"document"|
                                                 "voice"|"raw", ...the helper's keyword arguments};
                                                 file content as "content" (text) or "content_b64"
  GET    /_control/updates[?bot=]               updates still queued (not confirmed)
  POST   /_control/age {"seconds", "bot"?}      the queued updates were queued this much earlier
  POST   /_control/errors                       script_error's arguments    GET pending | DELETE all
  GET    /_control/requests[?bot=&method=]      recorded requests           DELETE forget them
  GET    /_control/sent[?bot=&chat_id=&since=]  messages the bots sent      DELETE forget them
  GET    /_control/actions[?bot=&chat_id=]      sendChatAction calls
  GET    /_control/drafts[?bot=&chat_id=]       sendMessageDraft calls     GET /_control/deleted deleteMessage
  GET    /_control/injected[?bot=&since=]       when each update was queued
  POST   /_control/files                        {"content"|"content_b64", "file_path"?, "size"?, "bot"?}
  POST   /_control/rate_limit                   {"min_interval": 1.0 | null, "retry_after"?: 1}
  POST   /_control/block {"chat_id"}            POST /_control/migrate {"chat_id", "to"}
  GET    /_control/webhook[?bot=]               {"info": getWebhookInfo, "deliveries": [...]}
  POST   /_control/reset                        forget requests, sent, actions, errors, rules, queues

Bot tokens are never recorded: records name the bot by its numeric id (the part before ":").
Everything is bounded: record and queue lengths, bodies, file sizes, waits, webhook retries.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import re
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.fake_server import FakeServerProcess, listen, serve_until_stopped

DEFAULT_TOKEN = "123456789:AAFakeTelegramTokenForTests_0123456789"
MAX_RECORDED = 5000
MAX_UPDATES = 10000
UPDATE_TTL_S = 24 * 3600  # Telegram keeps an update it could not hand over for 24 hours, then it is gone
MAX_RULES = 1000
MAX_FILES = 1000
MAX_MESSAGES_PER_CHAT = 1000
MAX_BODY = 60 * 1024 * 1024
MAX_POLL_TIMEOUT = 50.0
MAX_TEXT = 4096
MAX_CAPTION = 1024
MAX_DOWNLOAD = 20 * 1024 * 1024
WEBHOOK_TIMEOUT = 10.0

CONFLICT_POLL = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
CONFLICT_WEBHOOK = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"
)
CHAT_ACTIONS = {
    "typing", "upload_photo", "record_video", "upload_video", "record_voice", "upload_voice",
    "upload_document", "choose_sticker", "find_location", "record_video_note", "upload_video_note",
}
HTML_TAGS = {
    "a", "b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "tg-emoji",
    "code", "pre", "blockquote",
}
_SECRET_OK = re.compile(r"[A-Za-z0-9_-]{1,256}")
_COMMAND = re.compile(r"(?<![\w/@])/[A-Za-z0-9_]{1,32}(?:@[A-Za-z0-9_]{3,32})?(?![\w@])")
_MENTION = re.compile(r"(?<![\w@/])@[A-Za-z0-9_]{5,32}(?!\w)")
_NO_OP_METHODS = {
    "setmycommands": True, "deletemycommands": True, "getmycommands": [],
    "answercallbackquery": True, "setmessagereaction": True, "logout": True, "close": True,
}


class ApiError(Exception):
    """An error answer: {"ok": false, "error_code", "description", "parameters"?}."""

    def __init__(self, code: int, description: str, parameters: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code} {description}")
        self.code = code
        self.description = description
        self.parameters = parameters or {}


def utf16_len(text: str) -> int:
    """Length in UTF-16 code units, the unit of Telegram's limits and entity offsets."""
    return len(text.encode("utf-16-le")) // 2


def _retry_after(value: Any) -> int | float:
    v = float(value)
    if not 0 <= v <= 3600:
        raise ValueError("retry_after must be 0..3600 s")
    return int(v) if v.is_integer() else v


def error_for(kind: str, *, retry_after: Any = 1, migrate_to_chat_id: int | None = None) -> ApiError:
    """The Bot API's answer for an error kind (see script_error)."""
    if kind == "flood":
        ra = _retry_after(retry_after)
        return ApiError(429, f"Too Many Requests: retry after {ra}", {"retry_after": ra})
    if kind == "parse":
        return ApiError(400, "Bad Request: can't parse entities: Unsupported start tag \"fake\" at byte offset 0")
    if kind == "blocked":
        return ApiError(403, "Forbidden: bot was blocked by the user")
    if kind == "migrate":
        to = int(migrate_to_chat_id if migrate_to_chat_id is not None else -1001000000001)
        return ApiError(400, "Bad Request: group chat was upgraded to a supergroup chat", {"migrate_to_chat_id": to})
    if kind == "server":
        return ApiError(500, "Internal Server Error")
    if kind == "chat_not_found":
        return ApiError(400, "Bad Request: chat not found")
    if kind == "conflict":
        return ApiError(409, CONFLICT_POLL)
    if kind == "unauthorized":
        return ApiError(401, "Unauthorized")
    raise ValueError(
        f"unknown error kind {kind!r}; known: flood parse blocked migrate server chat_not_found conflict unauthorized"
    )


def parse_html(text: str) -> str:
    """The plain text Telegram makes of `text` with parse_mode=HTML, or ApiError 400 can't parse entities.

    Follows Telegram's HTML parser: only the supported tags, properly nested; a "<" always opens a tag;
    &lt; &gt; &amp; &quot; and numeric entities are decoded, any other "&" stays literal.
    """
    out: list[str] = []
    stack: list[str] = []
    i, n = 0, len(text)

    def fail(msg: str) -> ApiError:
        return ApiError(400, f"Bad Request: can't parse entities: {msg}")

    def byte_offset(k: int) -> int:
        return len(text[:k].encode())

    while i < n:
        c = text[i]
        if c == "&":
            m = re.match(r"&(?:(lt|gt|amp|quot)|#([0-9]{1,7})|#[xX]([0-9a-fA-F]{1,6}));", text[i:])
            if m:
                name, dec, hexa = m.groups()
                code = int(dec) if dec else int(hexa, 16) if hexa else None
                if code is None:
                    out.append({"lt": "<", "gt": ">", "amp": "&", "quot": '"'}[name])
                    i += m.end()
                    continue
                if 0 < code <= 0x10FFFF and not 0xD800 <= code <= 0xDFFF:
                    out.append(chr(code))
                    i += m.end()
                    continue
            out.append("&")
            i += 1
            continue
        if c != "<":
            out.append(c)
            i += 1
            continue
        start = i
        end = text.find(">", i + 1)
        if text.startswith("</", i):
            if end < 0:
                raise fail(f"Unclosed end tag at byte offset {byte_offset(start)}")
            name = text[i + 2:end].strip().lower()
            if not stack:
                raise fail(f"Unexpected end tag at byte offset {byte_offset(start)}")
            if name != stack[-1]:
                raise fail(
                    f"Unmatched end tag at byte offset {byte_offset(start)}, expected \"</{stack[-1]}>\", "
                    f"found \"</{name}>\""
                )
            stack.pop()
            i = end + 1
            continue
        m = re.match(r"<([a-zA-Z0-9-]*)", text[i:])
        name = m.group(1).lower() if m else ""
        if name not in HTML_TAGS:
            raise fail(f"Unsupported start tag \"{name}\" at byte offset {byte_offset(start)}")
        if end < 0:
            raise fail(f"Unclosed start tag at byte offset {byte_offset(start)}")
        attrs = text[i + 1 + len(name):end]
        if attrs and not attrs[0].isspace():
            raise fail(f"Unsupported start tag \"{name}{attrs}\" at byte offset {byte_offset(start)}")
        if not re.fullmatch(r"(\s+[a-zA-Z-]+(\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s\"'=<>`]+))?)*\s*", attrs):
            raise fail(f"Unclosed start tag at byte offset {byte_offset(start)}")
        if name == "span" and not re.search(r"class\s*=\s*[\"']?tg-spoiler", attrs):
            raise fail("Tag \"span\" must have class \"tg-spoiler\" at byte offset " + str(byte_offset(start)))
        stack.append(name)
        i = end + 1
    if stack:
        raise fail(f"Can't find end tag corresponding to start tag \"{stack[-1]}\"")
    return "".join(out)


def auto_entities(text: str) -> list[dict[str, Any]]:
    """bot_command and mention entities as Telegram adds them (offsets and lengths in UTF-16 units)."""
    found = [(m, "bot_command") for m in _COMMAND.finditer(text)] + [(m, "mention") for m in _MENTION.finditer(text)]
    found.sort(key=lambda x: x[0].start())
    return [
        {"offset": utf16_len(text[:m.start()]), "length": utf16_len(m.group()), "type": kind} for m, kind in found
    ]


class _Bot:
    """One bot's state: its update queue, poller, webhook, files and chats."""

    def __init__(self, token: str, username: str | None, first_update_id: int) -> None:
        if ":" not in token or not token.split(":", 1)[0].isdigit():
            raise ValueError(f"a bot token looks like <digits>:<secret>, got {token[:12]!r}...")
        self.token = token
        self.id = int(token.split(":", 1)[0])
        self.username = username or f"fake{self.id}_bot"
        self.updates: deque[tuple[int, Any]] = deque()
        self.queued_at: dict[int, float] = {}  # update_id -> time.time() it was queued (aged by age_updates)
        self.next_update_id = first_update_id
        self.changed = asyncio.Event()
        self.poll_seq = 0
        self.webhook: dict[str, Any] | None = None
        self.webhook_task: asyncio.Task[None] | None = None
        self.last_error: tuple[int, str] | None = None
        self.files: dict[str, dict[str, Any]] = {}
        self.file_paths: dict[str, str] = {}
        self.chats: dict[int, dict[str, Any]] = {}
        self.messages: dict[int, dict[int, dict[str, Any]]] = {}
        self.next_message_id: dict[int, int] = {}
        self.last_send: dict[int, float] = {}

    def pulse(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    def user(self) -> dict[str, Any]:
        return {"id": self.id, "is_bot": True, "first_name": "Fake Bot", "username": self.username}


class FakeTelegram:
    """The fake Bot API in the current event loop; `async with` starts and stops it."""

    def __init__(
        self,
        tokens: list[str] | tuple[str, ...] | dict[str, str | None] = (DEFAULT_TOKEN,),
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        first_update_id: int = 10000,
        webhook_backoff: tuple[float, float] = (0.05, 2.0),
        webhook_attempts: int = 8,
        strict_replies: bool = True,
    ) -> None:
        self.host = host
        self.port = port
        self.first_update_id = first_update_id
        self.webhook_backoff = webhook_backoff
        self.webhook_attempts = max(1, min(int(webhook_attempts), 100))
        self.strict_replies = strict_replies
        self._bots: list[_Bot] = []
        self._requests: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._sent: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._actions: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._drafts: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._deleted: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._deliveries: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._injected: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._dropped: deque[dict[str, Any]] = deque(maxlen=MAX_RECORDED)
        self._rules: list[dict[str, Any]] = []
        self._blocked: set[int] = set()
        self._migrated: dict[int, int] = {}
        self._rate: tuple[float, Any] | None = None
        self._file_seq = 0
        self._closing: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        items = tokens.items() if isinstance(tokens, dict) else ((t, None) for t in tokens)
        for token, username in items:
            self.add_bot(token, username)

    # --- lifecycle ---

    @property
    def url(self) -> str:
        """The API base, in place of https://api.telegram.org."""
        return f"http://{self.host}:{self.port}"

    @property
    def token(self) -> str:
        return self._bots[0].token

    def bot_url(self, bot: int | str | None = None) -> str:
        """f"{url}/bot{token}": append "/<method>"."""
        return f"{self.url}/bot{self._bot(bot).token}"

    def file_url(self, file_path: str, bot: int | str | None = None) -> str:
        return f"{self.url}/file/bot{self._bot(bot).token}/{file_path}"

    async def start(self) -> FakeTelegram:
        self._closing = asyncio.Event()
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WEBHOOK_TIMEOUT))
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([
            web.route("*", "/bot{token}/{method}", self._api),
            web.get("/file/bot{token}/{path:.+}", self._download),
            web.get("/_control/health", self._c_health),
            web.get("/_control/bots", self._c_bots),
            web.post("/_control/bots", self._c_add_bot),
            web.get("/_control/updates", self._c_updates),
            web.post("/_control/updates", self._c_inject),
            web.get("/_control/errors", self._c_errors),
            web.post("/_control/errors", self._c_add_error),
            web.delete("/_control/errors", self._c_clear_errors),
            web.get("/_control/requests", self._c_requests),
            web.delete("/_control/requests", self._c_clear_requests),
            web.get("/_control/sent", self._c_sent),
            web.delete("/_control/sent", self._c_clear_sent),
            web.get("/_control/actions", self._c_actions),
            web.get("/_control/drafts", self._c_drafts),
            web.get("/_control/deleted", self._c_deleted),
            web.get("/_control/injected", self._c_injected),
            web.post("/_control/age", self._c_age),
            web.get("/_control/dropped", self._c_dropped),
            web.post("/_control/files", self._c_files),
            web.post("/_control/rate_limit", self._c_rate_limit),
            web.post("/_control/block", self._c_block),
            web.post("/_control/migrate", self._c_migrate),
            web.get("/_control/webhook", self._c_webhook),
            web.post("/_control/reset", self._c_reset),
        ])
        self._runner, self.port = await listen(app, self.host, self.port)
        return self

    async def stop(self) -> None:
        if self._closing is not None:
            self._closing.set()
        for b in self._bots:
            b.pulse()
            if b.webhook_task is not None:
                b.webhook_task.cancel()
        tasks = [b.webhook_task for b in self._bots if b.webhook_task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> FakeTelegram:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- bots ---

    def add_bot(self, token: str, username: str | None = None) -> int:
        """Serve one more bot; returns its id."""
        if any(b.token == token for b in self._bots):
            raise ValueError("that token is already served")
        b = _Bot(token, username, self.first_update_id)
        self._bots.append(b)
        return b.id

    def _bot(self, key: int | str | None = None) -> _Bot:
        if key is None:
            return self._bots[0]
        for b in self._bots:
            if key == b.token or str(key) == str(b.id):
                return b
        raise ValueError(f"no such bot {str(key)[:12]!r}")

    @property
    def bots(self) -> list[dict[str, Any]]:
        return [{"id": b.id, "username": b.username} for b in self._bots]

    # --- injecting updates ---

    def inject(self, update: Any, *, bot: int | str | None = None, assign_id: bool = True) -> Any:
        """Queue an update as is (malformed ones too). A dict gets the next update_id unless assign_id=False;
        offsets always work on the fake's own sequence, whatever the payload says."""
        b = self._bot(bot)
        if len(b.updates) >= MAX_UPDATES:
            raise ValueError(f"at most {MAX_UPDATES} queued updates per bot")
        uid = b.next_update_id
        b.next_update_id += 1
        if isinstance(update, dict) and assign_id:
            update = {"update_id": uid, **{k: v for k, v in update.items() if k != "update_id"}}
        b.updates.append((uid, update))
        b.queued_at[uid] = time.time()
        self._injected.append({"bot": b.id, "update_id": uid, "ts": time.time()})
        b.pulse()
        return update

    def message(
        self,
        text: str | None = None,
        *,
        user: int | dict[str, Any] | None = None,
        chat_id: int | None = None,
        chat_type: str | None = None,
        title: str | None = None,
        reply_to: int | dict[str, Any] | None = None,
        entities: list[dict[str, Any]] | None = None,
        message_id: int | None = None,
        date: int | None = None,
        extra: dict[str, Any] | None = None,
        bot: int | str | None = None,
        _field: str = "message",
    ) -> dict[str, Any]:
        """Queue {"message": ...}: a text message (private unless chat_id < 0). entities=None adds
        bot_command and mention entities like Telegram; pass [] for none. reply_to: a message id in that chat
        (the message is embedded when the chat had it) or a whole message dict."""
        b = self._bot(bot)
        msg = self._new_message(b, user, chat_id, chat_type, title, message_id, date)
        if text is not None:
            msg["text"] = text
            ents = auto_entities(text) if entities is None else entities
            if ents:
                msg["entities"] = ents
        if reply_to is not None:
            msg["reply_to_message"] = self._reply_target(b, msg["chat"]["id"], reply_to)
        msg.update(extra or {})
        self._remember(b, msg)
        return self.inject({_field: msg}, bot=b.id)

    def edited_message(
        self, message_id: int, text: str, *, chat_id: int | None = None, user: int | dict[str, Any] | None = None,
        edit_date: int | None = None, bot: int | str | None = None,
    ) -> dict[str, Any]:
        """Queue {"edited_message": ...}: the new version of a message the chat had (or a fresh one)."""
        b = self._bot(bot)
        sender = _user(user)
        cid = chat_id if chat_id is not None else sender["id"]
        old = b.messages.get(cid, {}).get(message_id)
        msg = dict(old) if old else self._new_message(b, user, cid, None, None, message_id, None)
        msg["text"] = text
        msg.pop("caption", None)
        ents = auto_entities(text)
        msg.pop("entities", None)
        if ents:
            msg["entities"] = ents
        msg["edit_date"] = int(edit_date or time.time())
        self._remember(b, msg)
        return self.inject({"edited_message": msg}, bot=b.id)

    def photo(
        self, content: bytes, *, caption: str | None = None, size: int | None = None, **kw: Any
    ) -> dict[str, Any]:
        """Queue a photo message: a thumbnail and the full size (the last, largest PhotoSize), both
        downloadable; message()'s keywords apply."""
        bot = kw.get("bot")
        thumb = self.add_file(content[:64], file_path=None, suffix=".jpg", folder="thumbnails", bot=bot)
        full = self.add_file(content, suffix=".jpg", folder="photos", size=size, bot=bot)
        sizes = [
            {**_file_ref(thumb), "width": 90, "height": 67},
            {**_file_ref(full), "width": 1280, "height": 960},
        ]
        return self._media("photo", sizes, caption, kw)

    def document(
        self, content: bytes, *, file_name: str = "file.txt", mime_type: str = "text/plain",
        caption: str | None = None, size: int | None = None, **kw: Any,
    ) -> dict[str, Any]:
        f = self.add_file(content, suffix=Path(file_name).suffix, folder="documents", size=size, bot=kw.get("bot"))
        return self._media("document", {**_file_ref(f), "file_name": file_name, "mime_type": mime_type}, caption, kw)

    def voice(
        self, content: bytes, *, duration: int = 1, mime_type: str = "audio/ogg", caption: str | None = None,
        size: int | None = None, **kw: Any,
    ) -> dict[str, Any]:
        f = self.add_file(content, suffix=".oga", folder="voice", size=size, bot=kw.get("bot"))
        return self._media("voice", {**_file_ref(f), "duration": duration, "mime_type": mime_type}, caption, kw)

    def _media(self, field: str, value: Any, caption: str | None, kw: dict[str, Any]) -> dict[str, Any]:
        extra = {field: value, **(kw.pop("extra", None) or {})}
        if caption is not None:
            extra["caption"] = caption
            ents = auto_entities(caption)
            if ents:
                extra["caption_entities"] = ents
        return self.message(None, extra=extra, **kw)

    def _new_message(
        self, b: _Bot, user: Any, chat_id: int | None, chat_type: str | None, title: str | None,
        message_id: int | None, date: int | None,
    ) -> dict[str, Any]:
        sender = _user(user)
        cid = int(chat_id) if chat_id is not None else sender["id"]
        chat = self._chat(b, cid, chat_type, title, sender)
        return {
            "message_id": int(message_id) if message_id is not None else self._next_message_id(b, cid),
            "from": sender,
            "chat": chat,
            "date": int(date or time.time()),
        }

    def _chat(
        self, b: _Bot, cid: int, chat_type: str | None, title: str | None, sender: dict[str, Any]
    ) -> dict[str, Any]:
        known = b.chats.get(cid)
        if known and chat_type in (None, known["type"]) and title in (None, known.get("title")):
            return dict(known)
        kind = chat_type or ("private" if cid > 0 else "supergroup" if cid < -1_000_000_000_000 else "group")
        if kind == "private":
            chat = {"id": cid, "type": kind, "first_name": sender.get("first_name", "")}
            if sender.get("username"):
                chat["username"] = sender["username"]
        else:
            chat = {"id": cid, "type": kind, "title": title or f"Group {cid}"}
        if len(b.chats) < MAX_RECORDED:
            b.chats[cid] = chat
        return dict(chat)

    def _next_message_id(self, b: _Bot, cid: int) -> int:
        n = b.next_message_id.get(cid, 1)
        b.next_message_id[cid] = n + 1
        return n

    def _remember(self, b: _Bot, msg: dict[str, Any]) -> None:
        cid, mid = msg["chat"]["id"], msg["message_id"]
        store = b.messages.setdefault(cid, {})
        store[mid] = msg
        while len(store) > MAX_MESSAGES_PER_CHAT:
            del store[next(iter(store))]
        if mid >= b.next_message_id.get(cid, 1):
            b.next_message_id[cid] = mid + 1

    def _reply_target(self, b: _Bot, cid: int, reply_to: int | dict[str, Any]) -> dict[str, Any]:
        if isinstance(reply_to, dict):
            return reply_to
        known = b.messages.get(cid, {}).get(int(reply_to))
        if known:
            return {k: v for k, v in known.items() if k != "reply_to_message"}
        return {"message_id": int(reply_to), "chat": b.chats.get(cid, {"id": cid}), "date": int(time.time())}

    # --- files ---

    def add_file(
        self, content: bytes, *, file_path: str | None = None, size: int | None = None, suffix: str = "",
        folder: str = "documents", bot: int | str | None = None,
    ) -> dict[str, Any]:
        """A file the bot can getFile and download; size overrides the reported file_size (a 25 MB claim
        without 25 MB of memory). Returns {"file_id", "file_unique_id", "file_size", "file_path"}."""
        b = self._bot(bot)
        if len(content) > MAX_BODY:
            raise ValueError(f"file content over {MAX_BODY} bytes")
        if len(b.files) >= MAX_FILES:
            raise ValueError(f"at most {MAX_FILES} files per bot")
        self._file_seq += 1
        n = self._file_seq
        path = file_path or f"{folder}/file_{n}{suffix}"
        info = {
            "file_id": f"FAKE-{b.id}-{n}-" + hashlib.sha256(content).hexdigest()[:12],
            "file_unique_id": f"U{n}",
            "file_size": int(size if size is not None else len(content)),
            "file_path": path,
        }
        b.files[info["file_id"]] = {**info, "content": bytes(content)}
        b.file_paths[path] = info["file_id"]
        return info

    def file_content(self, file_id: str, bot: int | str | None = None) -> bytes:
        return self._bot(bot).files[file_id]["content"]

    # --- scripting ---

    def script_error(
        self, method: str, kind: str, *, times: int = 1, chat_id: int | None = None, retry_after: Any = 1,
        migrate_to_chat_id: int | None = None, error_code: int | None = None, description: str | None = None,
        bot: int | str | None = None,
    ) -> dict[str, Any]:
        """The next `times` calls of `method` ("*": any; for chat_id only) by the bot fail with `kind`."""
        error_for(kind, retry_after=retry_after, migrate_to_chat_id=migrate_to_chat_id)  # validates
        if not 1 <= int(times) <= 10000:
            raise ValueError("times must be 1..10000")
        if len(self._rules) >= MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} scripted errors")
        rule = {
            "bot": self._bot(bot).id, "method": method.lower(), "kind": kind, "times": int(times),
            "chat_id": None if chat_id is None else int(chat_id), "retry_after": retry_after,
            "migrate_to_chat_id": migrate_to_chat_id, "error_code": error_code, "description": description,
        }
        self._rules.append(rule)
        return rule

    @property
    def scripted(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rules]

    def clear_errors(self) -> None:
        self._rules.clear()

    def block(self, chat_id: int) -> None:
        """The user blocked the bots: every later send to chat_id is 403."""
        self._blocked.add(int(chat_id))

    def migrate(self, chat_id: int, to: int) -> None:
        """The group became a supergroup: every later send to chat_id is 400 with migrate_to_chat_id."""
        self._migrated[int(chat_id)] = int(to)

    def set_rate_limit(self, min_interval: float | None, retry_after: Any = None) -> None:
        """Per-chat flood control: a send to a chat less than min_interval s after the last one is 429 with
        retry_after (default: the rest of the interval, rounded up, at least 1). None switches it off."""
        if min_interval is None:
            self._rate = None
            return
        if not 0 < float(min_interval) <= 3600:
            raise ValueError("min_interval must be 0..3600 s")
        self._rate = (float(min_interval), None if retry_after is None else _retry_after(retry_after))

    # --- reading what happened ---

    def requests(self, method: str | None = None, bot: int | str | None = None) -> list[dict[str, Any]]:
        bid = None if bot is None else self._bot(bot).id
        return [
            r for r in self._requests
            if (method is None or r["method"].lower() == method.lower()) and bid in (None, r["bot"])
        ]

    def sent(self, chat_id: int | None = None, bot: int | str | None = None,
             since: float | None = None) -> list[dict[str, Any]]:
        bid = None if bot is None else self._bot(bot).id
        return [s for s in self._sent if chat_id in (None, s["chat_id"]) and bid in (None, s["bot"])
                and (since is None or s["ts"] >= since)]

    def actions(self, chat_id: int | None = None, bot: int | str | None = None) -> list[dict[str, Any]]:
        bid = None if bot is None else self._bot(bot).id
        return [a for a in self._actions if chat_id in (None, a["chat_id"]) and bid in (None, a["bot"])]

    def drafts(self, chat_id: int | None = None, bot: int | str | None = None) -> list[dict[str, Any]]:
        bid = None if bot is None else self._bot(bot).id
        return [d for d in self._drafts if chat_id in (None, d["chat_id"]) and bid in (None, d["bot"])]

    def deleted(self, chat_id: int | None = None) -> list[dict[str, Any]]:
        return [d for d in self._deleted if chat_id in (None, d["chat_id"])]

    def injected(self, bot: int | str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        bid = None if bot is None else self._bot(bot).id
        return [i for i in self._injected if bid in (None, i["bot"]) and (since is None or i["ts"] >= since)]

    @property
    def deliveries(self) -> list[dict[str, Any]]:
        return list(self._deliveries)

    def pending_updates(self, bot: int | str | None = None) -> list[Any]:
        b = self._bot(bot)
        self._expire(b)
        return [u for _, u in b.updates]

    def webhook_info(self, bot: int | str | None = None) -> dict[str, Any]:
        b = self._bot(bot)
        info: dict[str, Any] = {
            "url": (b.webhook or {}).get("url", ""), "has_custom_certificate": False,
            "pending_update_count": len(b.updates),
        }
        if b.webhook:
            info["max_connections"] = b.webhook.get("max_connections", 40)
        if b.last_error:
            info["last_error_date"], info["last_error_message"] = b.last_error
        return info

    def reset(self) -> None:
        self._requests.clear()
        self._sent.clear()
        self._actions.clear()
        self._drafts.clear()
        self._deleted.clear()
        self._deliveries.clear()
        self._injected.clear()
        self._dropped.clear()
        self._rules.clear()
        self._blocked.clear()
        self._migrated.clear()
        self._rate = None
        for b in self._bots:
            b.updates.clear()
            b.last_send.clear()

    # --- the Bot API ---

    async def _api(self, request: web.Request) -> web.StreamResponse:
        token, method = request.match_info["token"], request.match_info["method"]
        b = next((x for x in self._bots if x.token == token), None)
        record: dict[str, Any] = {
            "bot": b.id if b else None, "method": method, "http": request.method, "params": {}, "ts": time.time(),
        }
        self._requests.append(record)
        try:
            if b is None:
                raise ApiError(401, "Unauthorized")
            params = await _params(request)
            record["params"] = _public(params)
            result = await self._call(b, method.lower(), params)
        except ApiError as e:
            record.update(status=e.code, error=e.description)
            body: dict[str, Any] = {"ok": False, "error_code": e.code, "description": e.description}
            if e.parameters:
                body["parameters"] = e.parameters
            return web.json_response(body, status=e.code)
        record["status"] = 200
        return web.json_response({"ok": True, "result": result})

    async def _call(self, b: _Bot, method: str, p: dict[str, Any]) -> Any:
        self._scripted(b, method, p)
        if method == "getme":
            return {**b.user(), "can_join_groups": True, "can_read_all_group_messages": False,
                    "supports_inline_queries": False}
        if method == "getupdates":
            return await self._get_updates(b, p)
        if method == "setwebhook":
            return self._set_webhook(b, p)
        if method == "deletewebhook":
            return self._delete_webhook(b, p)
        if method == "getwebhookinfo":
            return self.webhook_info(b.id)
        if method == "sendmessage":
            return self._send(b, p, "text")
        if method in ("sendphoto", "senddocument", "sendvoice"):
            return self._send(b, p, method[4:])
        if method == "sendchataction":
            cid = self._target_chat(b, p)
            action = p.get("action")
            if action not in CHAT_ACTIONS:
                raise ApiError(400, "Bad Request: wrong parameter action in request")
            self._actions.append({"bot": b.id, "chat_id": cid, "action": action, "ts": time.time()})
            return True
        if method == "editmessagetext":
            return self._edit(b, p)
        if method == "sendmessagedraft":
            return self._draft(b, p)
        if method == "deletemessage":
            return self._delete(b, p)
        if method == "getfile":
            fid = p.get("file_id")
            f = b.files.get(fid) if isinstance(fid, str) else None
            if f is None:
                raise ApiError(400, "Bad Request: invalid file_id")
            if f["file_size"] > MAX_DOWNLOAD:
                raise ApiError(400, "Bad Request: file is too big")
            return {k: v for k, v in f.items() if k != "content"}
        if method in _NO_OP_METHODS:
            return _NO_OP_METHODS[method]
        raise ApiError(404, "Not Found")

    def _scripted(self, b: _Bot, method: str, p: dict[str, Any]) -> None:
        chat = p.get("chat_id")
        for i, r in enumerate(self._rules):
            if r["bot"] != b.id or r["method"] not in ("*", method):
                continue
            if r["chat_id"] is not None and str(r["chat_id"]) != str(chat):
                continue
            r["times"] -= 1
            if r["times"] <= 0:
                del self._rules[i]
            e = error_for(r["kind"], retry_after=r["retry_after"], migrate_to_chat_id=r["migrate_to_chat_id"])
            raise ApiError(r["error_code"] or e.code, r["description"] or e.description, e.parameters)

    # getUpdates and webhooks

    async def _get_updates(self, b: _Bot, p: dict[str, Any]) -> list[Any]:
        if b.webhook:
            raise ApiError(409, CONFLICT_WEBHOOK)
        offset = _int(p, "offset", 0)
        limit = max(1, min(_int(p, "limit", 100), 100))
        timeout = max(0.0, min(_num(p, "timeout", 0), MAX_POLL_TIMEOUT))
        b.poll_seq += 1
        me = b.poll_seq
        b.pulse()  # ends the poll in flight, if any
        self._expire(b)
        if offset > 0:
            while b.updates and b.updates[0][0] < offset:
                b.updates.popleft()
        elif offset < 0:
            while len(b.updates) > -offset:
                b.updates.popleft()
        deadline = time.monotonic() + timeout
        assert self._closing is not None
        while True:
            if b.poll_seq != me:
                raise ApiError(409, CONFLICT_POLL)
            if b.webhook:
                raise ApiError(409, CONFLICT_WEBHOOK)
            self._expire(b)
            ready = [u for uid, u in b.updates if uid >= offset][:limit]
            left = deadline - time.monotonic()
            if ready or left <= 0 or self._closing.is_set():
                return ready
            changed = b.changed
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                pass

    def _expire(self, b: _Bot) -> None:
        """Drop the updates queued longer than UPDATE_TTL_S, as Telegram does: nobody will get them."""
        cutoff = time.time() - UPDATE_TTL_S
        keep = deque()
        for uid, u in b.updates:
            if b.queued_at.get(uid, cutoff + 1) <= cutoff:
                self._dropped.append({"bot": b.id, "update_id": uid, "ts": time.time()})
                b.queued_at.pop(uid, None)
            else:
                keep.append((uid, u))
        if len(keep) != len(b.updates):
            b.updates.clear()
            b.updates.extend(keep)
        for uid in [k for k in b.queued_at if not b.updates or k < b.updates[0][0]]:
            del b.queued_at[uid]  # confirmed ones

    def age_updates(self, seconds: float, bot: int | str | None = None) -> int:
        """As if every queued update had been queued ``seconds`` earlier; returns how many are queued."""
        b = self._bot(bot)
        for uid in b.queued_at:
            b.queued_at[uid] -= float(seconds)
        return len(b.updates)

    def dropped(self) -> list[dict[str, Any]]:
        """Updates dropped unhanded after UPDATE_TTL_S: {"bot", "update_id", "ts"}."""
        return list(self._dropped)

    def _set_webhook(self, b: _Bot, p: dict[str, Any]) -> bool:
        url = str(p.get("url") or "")
        if not url:
            return self._delete_webhook(b, p)
        if not url.startswith(("http://", "https://")):
            raise ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided for webhook")
        secret = p.get("secret_token")
        if secret is not None and not _SECRET_OK.fullmatch(str(secret)):
            raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        if _truthy(p.get("drop_pending_updates")):
            b.updates.clear()
        b.webhook = {"url": url, "secret_token": secret, "max_connections": _int(p, "max_connections", 40)}
        b.last_error = None
        b.pulse()
        if b.webhook_task is None or b.webhook_task.done():
            b.webhook_task = asyncio.get_running_loop().create_task(self._deliver(b))
        return True

    def _delete_webhook(self, b: _Bot, p: dict[str, Any]) -> bool:
        if _truthy(p.get("drop_pending_updates")):
            b.updates.clear()
        b.webhook = None
        b.pulse()
        return True

    async def _deliver(self, b: _Bot) -> None:
        """POST queued updates to the webhook, oldest first, one at a time; retry with backoff, then drop."""
        assert self._closing is not None and self._session is not None
        attempt = 0
        while b.webhook and not self._closing.is_set():
            self._expire(b)
            if not b.updates:
                changed = b.changed
                await changed.wait()
                continue
            hook = b.webhook
            uid, update = b.updates[0]
            headers = {"Content-Type": "application/json"}
            if hook.get("secret_token"):
                headers["X-Telegram-Bot-Api-Secret-Token"] = str(hook["secret_token"])
            attempt += 1
            status, error = 0, ""
            try:
                async with self._session.post(hook["url"], data=json.dumps(update), headers=headers) as resp:
                    status = resp.status
                    await resp.read()
                    if not 200 <= status < 300:
                        error = f"Wrong response from the webhook: {status} {resp.reason}"
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                error = f"Connection failed: {type(e).__name__}"
            self._deliveries.append(
                {"bot": b.id, "update_id": uid, "url": hook["url"], "attempt": attempt, "status": status,
                 "error": error, "ts": time.time()}
            )
            if not error or attempt >= self.webhook_attempts:
                if b.updates and b.updates[0][0] == uid:
                    b.updates.popleft()
                attempt = 0
                if error:
                    b.last_error = (int(time.time()), error)
                continue
            b.last_error = (int(time.time()), error)
            first, cap = self.webhook_backoff
            try:
                await asyncio.wait_for(self._closing.wait(), min(cap, first * 2 ** (attempt - 1)))
            except TimeoutError:
                pass

    # sending

    def _target_chat(self, b: _Bot, p: dict[str, Any]) -> int:
        raw = p.get("chat_id")
        if raw is None or raw == "":
            raise ApiError(400, "Bad Request: chat_id is empty")
        try:
            cid = int(raw)
        except (TypeError, ValueError):
            raise ApiError(400, "Bad Request: chat not found") from None
        if cid in self._migrated:
            raise error_for("migrate", migrate_to_chat_id=self._migrated[cid])
        if cid in self._blocked:
            raise error_for("blocked")
        return cid

    def _check_text(self, text: Any, parse_mode: Any, limit: int, what: str) -> str:
        text = "" if text is None else str(text)
        if parse_mode is not None and str(parse_mode).lower() == "html":
            plain = parse_html(text)
        elif parse_mode is None or str(parse_mode).lower() in ("", "markdown", "markdownv2"):
            plain = text
        else:
            raise ApiError(400, "Bad Request: unsupported parse_mode")
        if utf16_len(plain) > limit:
            raise ApiError(400, f"Bad Request: {what} is too long")
        return plain

    def _reply_to(self, b: _Bot, cid: int, p: dict[str, Any]) -> int | None:
        rp = p.get("reply_parameters")
        if isinstance(rp, str):
            try:
                rp = json.loads(rp)
            except ValueError:
                raise ApiError(400, "Bad Request: can't parse reply parameters JSON object") from None
        if isinstance(rp, dict):
            mid, allow = rp.get("message_id"), rp.get("allow_sending_without_reply")
        else:
            mid, allow = p.get("reply_to_message_id"), p.get("allow_sending_without_reply")
        if mid in (None, ""):
            return None
        try:
            mid = int(mid)
        except (TypeError, ValueError):
            raise ApiError(400, "Bad Request: message to be replied not found") from None
        if self.strict_replies and mid not in b.messages.get(cid, {}):
            if _truthy(allow):
                return None
            raise ApiError(400, "Bad Request: message to be replied not found")
        return mid

    def _rate_check(self, b: _Bot, cid: int) -> None:
        if self._rate is None:
            return
        interval, fixed = self._rate
        now = time.monotonic()
        last = b.last_send.get(cid)
        if last is not None and now - last < interval:
            ra = fixed if fixed is not None else max(1, math.ceil(interval - (now - last)))
            raise ApiError(429, f"Too Many Requests: retry after {ra}", {"retry_after": ra})
        b.last_send[cid] = now

    def _send(self, b: _Bot, p: dict[str, Any], kind: str) -> dict[str, Any]:
        cid = self._target_chat(b, p)
        parse_mode = p.get("parse_mode")
        media: Any = None
        if kind == "text":
            plain = self._check_text(p.get("text"), parse_mode, MAX_TEXT, "message")
            if not plain.strip():
                raise ApiError(400, "Bad Request: message text is empty")
        else:
            self._check_text(p.get("caption"), parse_mode, MAX_CAPTION, "message caption")
            media = self._media_param(b, p.get(kind), kind)
        reply = self._reply_to(b, cid, p)
        self._rate_check(b, cid)
        msg = {
            "message_id": self._next_message_id(b, cid), "from": b.user(),
            "chat": self._chat(b, cid, None, None, {"id": cid, "first_name": f"User{cid}"}),
            "date": int(time.time()),
        }
        if kind == "text":
            msg["text"] = plain
        else:
            msg[kind] = media
            if p.get("caption"):
                msg["caption"] = str(p["caption"])
        if reply is not None and reply in b.messages.get(cid, {}):
            msg["reply_to_message"] = {k: v for k, v in b.messages[cid][reply].items() if k != "reply_to_message"}
        self._remember(b, msg)
        record = {
            "bot": b.id, "chat_id": cid, "message_id": msg["message_id"], "kind": kind,
            "text": p.get("text") if kind == "text" else p.get("caption"), "parse_mode": parse_mode,
            "reply_to": reply, "ts": time.time(),
        }
        if media is not None:
            ref = media[-1] if isinstance(media, list) else media
            keys = ("file_id", "file_size", "file_name", "mime_type", "url")
            record["file"] = {k: ref[k] for k in keys if k in ref}
        self._sent.append(record)
        return msg

    def _media_param(self, b: _Bot, value: Any, kind: str) -> Any:
        if isinstance(value, dict) and "content" in value:  # an upload
            ext = Path(value.get("filename") or "").suffix
            f = self.add_file(value["content"], suffix=ext, folder={"photo": "photos"}.get(kind, kind + "s"), bot=b.id)
            ref = _file_ref(f)
            value = {**ref, "file_name": value.get("filename"), "mime_type": value.get("content_type")}
        elif isinstance(value, str) and value in b.files:
            value = _file_ref(b.files[value])
        elif isinstance(value, str) and value.startswith(("http://", "https://")):
            value = {"file_id": f"URL-{hashlib.sha256(value.encode()).hexdigest()[:12]}", "url": value}
        elif value in (None, ""):
            raise ApiError(400, f"Bad Request: there is no {kind} in the request")
        else:
            raise ApiError(400, "Bad Request: wrong file identifier/HTTP URL specified")
        if kind == "photo":
            return [{k: v for k, v in value.items() if k in ("file_id", "file_unique_id", "file_size", "url")}
                    | {"width": 1280, "height": 960}]
        if kind != "document":
            value.pop("file_name", None)
        return value

    def _edit(self, b: _Bot, p: dict[str, Any]) -> dict[str, Any]:
        cid = self._target_chat(b, p)
        mid = _int(p, "message_id", 0)
        old = b.messages.get(cid, {}).get(mid)
        if old is None or old.get("from", {}).get("id") != b.id:
            raise ApiError(400, "Bad Request: message to edit not found")
        plain = self._check_text(p.get("text"), p.get("parse_mode"), MAX_TEXT, "message")
        if not plain.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        if old.get("text") == plain:
            raise ApiError(
                400, "Bad Request: message is not modified: specified new message content and reply markup are "
                "exactly the same as a current content and reply markup of the message",
            )
        msg = {**old, "text": plain, "edit_date": int(time.time())}
        self._remember(b, msg)
        self._sent.append({
            "bot": b.id, "chat_id": cid, "message_id": mid, "kind": "edit", "text": p.get("text"),
            "parse_mode": p.get("parse_mode"), "reply_to": None, "ts": time.time(),
        })
        return msg

    def _draft(self, b: _Bot, p: dict[str, Any]) -> bool:
        """sendMessageDraft: a streamed preview, allowed in private chats only (a user's id is positive)."""
        cid = self._target_chat(b, p)
        if cid < 0:
            raise ApiError(400, "Bad Request: drafts can be sent to private chats only")  # fake's wording
        try:
            draft_id = int(p.get("draft_id"))
        except (TypeError, ValueError):
            raise ApiError(400, "Bad Request: parameter \"draft_id\" is required") from None
        if draft_id == 0 or not -2**31 <= draft_id < 2**31:
            raise ApiError(400, "Bad Request: invalid draft_id specified")
        thread = p.get("message_thread_id")
        if thread not in (None, "") and not str(thread).lstrip("-").isdigit():
            raise ApiError(400, "Bad Request: wrong message thread identifier specified")
        plain = self._check_text(p.get("text"), p.get("parse_mode"), MAX_TEXT, "message")
        if not plain.strip():
            raise ApiError(400, "Bad Request: message text is empty")
        self._drafts.append({"bot": b.id, "chat_id": cid, "draft_id": draft_id, "text": p.get("text"),
                             "parse_mode": p.get("parse_mode"), "ts": time.time()})
        return True

    def _delete(self, b: _Bot, p: dict[str, Any]) -> bool:
        cid = self._target_chat(b, p)
        mid = _int(p, "message_id", 0)
        if b.messages.get(cid, {}).pop(mid, None) is None:
            raise ApiError(400, "Bad Request: message to delete not found")
        self._deleted.append({"bot": b.id, "chat_id": cid, "message_id": mid, "ts": time.time()})
        return True

    async def _download(self, request: web.Request) -> web.StreamResponse:
        token, path = request.match_info["token"], request.match_info["path"]
        b = next((x for x in self._bots if x.token == token), None)
        self._requests.append(
            {"bot": b.id if b else None, "method": "file", "http": "GET", "params": {"file_path": path},
             "ts": time.time(), "status": 200 if b and path in b.file_paths else 404 if b else 401}
        )
        if b is None:
            return web.json_response({"ok": False, "error_code": 401, "description": "Unauthorized"}, status=401)
        fid = b.file_paths.get(path)
        if fid is None:
            return web.json_response({"ok": False, "error_code": 404, "description": "Not Found"}, status=404)
        return web.Response(body=b.files[fid]["content"], content_type="application/octet-stream")

    # --- control ---

    async def _c_health(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def _c_bots(self, request: web.Request) -> web.Response:
        return web.json_response(self.bots)

    async def _c_add_bot(self, request: web.Request) -> web.Response:
        return await _control(request, lambda d: {"id": self.add_bot(d["token"], d.get("username"))})

    async def _c_updates(self, request: web.Request) -> web.Response:
        return await _control(request, lambda d: self.pending_updates(request.query.get("bot")), body=False)

    async def _c_inject(self, request: web.Request) -> web.Response:
        def go(d: dict[str, Any]) -> Any:
            d = dict(d)
            kind = d.pop("kind", "message")
            if "content_b64" in d:
                d["content"] = base64.b64decode(d.pop("content_b64"))
            elif isinstance(d.get("content"), str):
                d["content"] = d["content"].encode()
            if kind == "raw":
                return self.inject(d.get("update"), bot=d.get("bot"), assign_id=d.get("assign_id", True))
            helpers = {"message": self.message, "edited_message": self.edited_message, "photo": self.photo,
                       "document": self.document, "voice": self.voice}
            if kind not in helpers:
                raise ValueError(f"kind must be one of {sorted(helpers) + ['raw']}")
            if kind in ("photo", "document", "voice"):
                return helpers[kind](d.pop("content", b""), **d)
            return helpers[kind](**d)

        return await _control(request, go)

    async def _c_errors(self, request: web.Request) -> web.Response:
        return web.json_response(self.scripted)

    async def _c_add_error(self, request: web.Request) -> web.Response:
        return await _control(request, lambda d: self.script_error(**d))

    async def _c_clear_errors(self, request: web.Request) -> web.Response:
        self.clear_errors()
        return web.json_response({"ok": True})

    async def _c_requests(self, request: web.Request) -> web.Response:
        q = request.query
        return await _control(request, lambda d: self.requests(q.get("method"), q.get("bot")), body=False)

    async def _c_clear_requests(self, request: web.Request) -> web.Response:
        self._requests.clear()
        return web.json_response({"ok": True})

    async def _c_sent(self, request: web.Request) -> web.Response:
        q = request.query
        return await _control(
            request, lambda d: self.sent(_opt_int(q.get("chat_id")), q.get("bot"), _opt_float(q.get("since"))),
            body=False,
        )

    async def _c_clear_sent(self, request: web.Request) -> web.Response:
        self._sent.clear()
        return web.json_response({"ok": True})

    async def _c_actions(self, request: web.Request) -> web.Response:
        q = request.query
        return await _control(
            request, lambda d: self.actions(_opt_int(q.get("chat_id")), q.get("bot")), body=False
        )

    async def _c_drafts(self, request: web.Request) -> web.Response:
        q = request.query
        return await _control(request, lambda d: self.drafts(_opt_int(q.get("chat_id")), q.get("bot")), body=False)

    async def _c_deleted(self, request: web.Request) -> web.Response:
        return await _control(request, lambda d: self.deleted(_opt_int(request.query.get("chat_id"))), body=False)

    async def _c_injected(self, request: web.Request) -> web.Response:
        q = request.query
        return await _control(request, lambda d: self.injected(q.get("bot"), _opt_float(q.get("since"))), body=False)

    async def _c_files(self, request: web.Request) -> web.Response:
        def go(d: dict[str, Any]) -> Any:
            content = base64.b64decode(d["content_b64"]) if "content_b64" in d else str(d.get("content", "")).encode()
            return self.add_file(content, file_path=d.get("file_path"), size=d.get("size"), bot=d.get("bot"))

        return await _control(request, go)

    async def _c_rate_limit(self, request: web.Request) -> web.Response:
        return await _control(
            request, lambda d: self.set_rate_limit(d.get("min_interval"), d.get("retry_after")) or {"ok": True}
        )

    async def _c_block(self, request: web.Request) -> web.Response:
        return await _control(request, lambda d: self.block(d["chat_id"]) or {"ok": True})

    async def _c_migrate(self, request: web.Request) -> web.Response:
        return await _control(request, lambda d: self.migrate(d["chat_id"], d["to"]) or {"ok": True})

    async def _c_webhook(self, request: web.Request) -> web.Response:
        def go(d: dict[str, Any]) -> Any:
            bid = self._bot(request.query.get("bot")).id
            return {"info": self.webhook_info(bid), "deliveries": [x for x in self._deliveries if x["bot"] == bid]}

        return await _control(request, go, body=False)

    async def _c_age(self, request: web.Request) -> web.Response:
        return await _control(request, lambda d: self.age_updates(float(d["seconds"]), d.get("bot")))

    async def _c_dropped(self, request: web.Request) -> web.Response:
        return await _control(request, lambda d: self.dropped(), body=False)

    async def _c_reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})


# --- helpers -------------------------------------------------------------------------------------------------


def _user(user: int | dict[str, Any] | None) -> dict[str, Any]:
    if isinstance(user, dict):
        return {"is_bot": False, **user}
    uid = 1001 if user is None else int(user)
    return {"id": uid, "is_bot": False, "first_name": f"User{uid}", "username": f"user{uid}"}


def _file_ref(info: dict[str, Any]) -> dict[str, Any]:
    return {k: info[k] for k in ("file_id", "file_unique_id", "file_size")}


def _truthy(v: Any) -> bool:
    return v is True or str(v).lower() in ("true", "1")


def _int(p: dict[str, Any], key: str, default: int) -> int:
    v = p.get(key)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ApiError(400, f"Bad Request: invalid {key} specified") from None


def _num(p: dict[str, Any], key: str, default: float) -> float:
    v = p.get(key)
    if v is None or v == "":
        return default
    try:
        return float(v)
    except (TypeError, ValueError):
        raise ApiError(400, f"Bad Request: invalid {key} specified") from None


def _opt_int(v: str | None) -> int | None:
    return None if v is None else int(v)


def _opt_float(v: str | None) -> float | None:
    return None if v is None else float(v)


async def _params(request: web.Request) -> dict[str, Any]:
    """The call's parameters: the query string, then the JSON, urlencoded or multipart body. Uploads
    become {"filename", "content_type", "size", "sha256", "content"} (content is not recorded)."""
    params: dict[str, Any] = dict(request.query)
    if request.method != "POST" or not request.can_read_body:
        return params
    ctype = request.content_type
    if ctype == "application/json":
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            raise ApiError(400, "Bad Request: can't parse JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Bad Request: JSON object expected")
        params.update(body)
    elif ctype == "multipart/form-data":
        reader = await request.multipart()
        async for part in reader:
            if part.name is None:
                continue
            data = bytearray()
            while chunk := await part.read_chunk():
                data += chunk
                if len(data) > MAX_BODY:
                    raise ApiError(413, "Request Entity Too Large")
            if part.filename is not None:
                params[part.name] = {
                    "filename": part.filename, "content_type": part.headers.get("Content-Type"),
                    "size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "content": bytes(data),
                }
            else:
                params[part.name] = data.decode("utf-8", "replace")
    else:
        params.update(await request.post())
    return params


def _public(params: dict[str, Any]) -> dict[str, Any]:
    return {k: ({kk: vv for kk, vv in v.items() if kk != "content"} if isinstance(v, dict) and "content" in v else v)
            for k, v in params.items()}


async def _control(request: web.Request, fn: Any, *, body: bool = True) -> web.Response:
    try:
        data = await request.json() if body and request.can_read_body else {}
        if not isinstance(data, dict):
            raise TypeError("expected a JSON object")
        return web.json_response(fn(data), dumps=_dumps)
    except (ValueError, KeyError, TypeError) as e:
        return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=400)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=lambda o: base64.b64encode(o).decode() if isinstance(o, bytes) else str(o))


# --- as a process of its own ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fake_telegram", description=__doc__.splitlines()[0])
    p.add_argument("--port-file", type=Path, required=True, help="where to write the port once listening")
    p.add_argument("--token", action="append", help=f"a bot token to serve (repeatable; default {DEFAULT_TOKEN})")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--lifetime", type=float, default=900.0, help="stop after this many seconds (default 900)")
    args = p.parse_args(argv)
    try:
        FakeTelegram(args.token or [DEFAULT_TOKEN])
    except ValueError as e:
        p.error(str(e))
    tokens = args.token or [DEFAULT_TOKEN]
    asyncio.run(serve_until_stopped(FakeTelegram(tokens, host=args.host, port=args.port), args.port_file,
                                    args.lifetime, "fake_telegram"))
    return 0


class FakeTelegramProcess(FakeServerProcess):
    """`python -m tests.fake_telegram` as a child process, for synchronous end-to-end tests; every wait bounded.

    The helpers mirror FakeTelegram's and go through the control endpoints; file content is bytes."""

    name = "fake_telegram"

    def __init__(self, workdir: Path, tokens: list[str] | tuple[str, ...] = (DEFAULT_TOKEN,), *,
                 lifetime: float = 600.0) -> None:
        super().__init__(workdir, lifetime=lifetime)
        self.tokens = list(tokens)

    @property
    def token(self) -> str:
        return self.tokens[0]

    def bot_url(self, token: str | None = None) -> str:
        return f"{self.url}/bot{token or self.token}"

    def extra_args(self) -> list[str]:
        return [arg for t in self.tokens for arg in ("--token", t)]

    def _inject(self, kind: str, content: bytes | None = None, **kw: Any) -> Any:
        if content is not None:
            kw["content_b64"] = base64.b64encode(content).decode()
        return self._call("POST", "/_control/updates", {"kind": kind, **kw})

    def message(self, text: str | None = None, **kw: Any) -> dict[str, Any]:
        return self._inject("message", text=text, **kw)

    def edited_message(self, message_id: int, text: str, **kw: Any) -> dict[str, Any]:
        return self._inject("edited_message", message_id=message_id, text=text, **kw)

    def photo(self, content: bytes, **kw: Any) -> dict[str, Any]:
        return self._inject("photo", content, **kw)

    def document(self, content: bytes, **kw: Any) -> dict[str, Any]:
        return self._inject("document", content, **kw)

    def voice(self, content: bytes, **kw: Any) -> dict[str, Any]:
        return self._inject("voice", content, **kw)

    def inject(self, update: Any, *, bot: int | str | None = None, assign_id: bool = True) -> Any:
        return self._inject("raw", update=update, bot=bot, assign_id=assign_id)

    def add_file(self, content: bytes, **kw: Any) -> dict[str, Any]:
        return self._call("POST", "/_control/files", {"content_b64": base64.b64encode(content).decode(), **kw})

    def script_error(self, method: str, kind: str, **kw: Any) -> dict[str, Any]:
        return self._call("POST", "/_control/errors", {"method": method, "kind": kind, **kw})

    def clear_errors(self) -> None:
        self._call("DELETE", "/_control/errors")

    def block(self, chat_id: int) -> None:
        self._call("POST", "/_control/block", {"chat_id": chat_id})

    def migrate(self, chat_id: int, to: int) -> None:
        self._call("POST", "/_control/migrate", {"chat_id": chat_id, "to": to})

    def set_rate_limit(self, min_interval: float | None, retry_after: Any = None) -> None:
        self._call("POST", "/_control/rate_limit", {"min_interval": min_interval, "retry_after": retry_after})

    def requests(self, method: str | None = None, bot: int | str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/requests", query={"method": method, "bot": bot})

    def sent(self, chat_id: int | None = None, bot: int | str | None = None,
             since: float | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/sent", query={"chat_id": chat_id, "bot": bot, "since": since})

    def actions(self, chat_id: int | None = None, bot: int | str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/actions", query={"chat_id": chat_id, "bot": bot})

    def drafts(self, chat_id: int | None = None, bot: int | str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/drafts", query={"chat_id": chat_id, "bot": bot})

    def deleted(self, chat_id: int | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/deleted", query={"chat_id": chat_id})

    def pending_updates(self, bot: int | str | None = None) -> list[Any]:
        return self._call("GET", "/_control/updates", query={"bot": bot})

    def injected(self, bot: int | str | None = None, since: float | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/injected", query={"bot": bot, "since": since})

    def age_updates(self, seconds: float, bot: int | str | None = None) -> int:
        return self._call("POST", "/_control/age", {"seconds": seconds, "bot": bot})

    def dropped(self) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/dropped")

    def webhook(self, bot: int | str | None = None) -> dict[str, Any]:
        return self._call("GET", "/_control/webhook", query={"bot": bot})

    def reset(self) -> None:
        self._call("POST", "/_control/reset", {})


if __name__ == "__main__":
    sys.exit(main())
