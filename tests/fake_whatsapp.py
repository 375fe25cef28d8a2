"""Fake WhatsApp Cloud API for tests: the Graph API at `{url}/v21.0/...`, a media CDN whose URLs expire, and a
webhook sender that posts signed deliveries to a gateway, all on 127.0.0.1.

In a test's event loop::

    async with FakeWhatsApp() as wa:                 # one token, one business number unless given
        api_base = wa.api_base                         # f"{url}/v21.0", in place of graph.facebook.com/v21.0
        wa.subscribe(gateway_url, app_secret)          # where webhooks go
        p = wa.message("16505551234", "hi")            # inbound text: opens the 24 h window, queued for delivery
        await wa.drain()                               # ...the gateway answers with POST /{id}/messages
        wa.sent(to="16505551234")                      # [{"id": "wamid..", "type": "text", "text": ..., "ts"}]

As a process: ``python -m tests.fake_whatsapp --port-file PATH [--token T] [--number ID:DISPLAY] [--webhook URL
--app-secret S] [--media-ttl S] [--window S] [--lifetime S]``; `FakeWhatsAppProcess` wraps it for synchronous tests
through the control endpoints. Plain functions (message_payload, statuses_payload, sign, post_webhook,
verify_webhook, wamid_of) build and post webhooks with no fake at all.

Cloud API behaviour (checked against Meta's documentation and its mirrors; the fake's own choices say "fake"):
  - Auth: `Authorization: Bearer` (or ?access_token=). None: 400 code 2500; wrong: 401 code 190 OAuthException
    "Invalid OAuth access token - Cannot parse access token". Errors are {"error": {"message": "(#<code>) <title>",
    "type": "OAuthException", "code", "error_subcode"?, "error_data": {"messaging_product", "details"},
    "fbtrace_id"}} with the HTTP status of Meta's table: 400 (100, 130429, 131026, 131047, 131053, 131056), 401
    (190), 404 (132001), 500 (131000). An unknown object (number or media id) is 400 code 100 subcode 33.
  - POST /{phone_number_id}/messages, JSON with messaging_product "whatsapp" and `to` (else 100): text (body
    1..4096 characters, else 100), image/document/audio/video/sticker (one of `id` - uploaded or inbound media;
    an unknown id is 100 at once (fake: Meta may fail it later with 131053) - or an http(s) `link`; caption
    <= 1024, none on audio/sticker), template (name + language.code; 132001 if `templates` is set and lacks it),
    reaction; `context.message_id` makes a reply. Answer {"messaging_product", "contacts": [{"input", "wa_id"}],
    "messages": [{"id": "wamid.."}]} (+ "message_status": "accepted" for a template); wa_id = the digits of `to`.
  - Read receipt, same endpoint: {"status": "read", "message_id", "typing_indicator": {"type": "text"}?} ->
    {"success": true}; an id the fake never delivered is 100 (fake; strict_reads).
  - The customer-service window: free-form to a number whose last inbound message (message(), at its timestamp)
    is over `window` s (24 h) old, or who never wrote, fails with 131047 "Re-engagement message"; templates always
    go. window_errors="webhook": accepted, then a `failed` status with 131047 (Meta often reports it that way).
  - POST /{phone_number_id}/media (multipart: file, type, messaging_product) -> {"id"}; image 5 MB, audio/video
    16 MB, sticker 500 KB, document 100 MB (over: 131053, fake's code). GET /{media_id} -> {"messaging_product",
    "url", "mime_type", "sha256" (hex), "file_size", "id"}; DELETE /{media_id}. The url (/whatsapp_business/
    attachments/?mid=&ext=&hash=) lives media_ttl s (Meta: 5 min) and wants the bearer token: else 401; expired
    or unknown 404 (fake's codes).
  - Webhooks: {"object": "whatsapp_business_account", "entry": [{"id": WABA, "changes": [{"field": "messages",
    "value": {"messaging_product", "metadata": {"display_phone_number", "phone_number_id"}, "contacts":
    [{"profile": {"name"}, "wa_id"}], "messages": [..]} or {.., "statuses": [..]}}]}]}. The body escapes
    non-ASCII as \\uXXXX (Meta signs that form) and is signed `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(app
    secret, raw body)>` (+ X-Hub-Signature sha1). Non-2xx or no answer: retried with exponential backoff
    (webhook_backoff, short; Meta keeps trying "with decreasing frequency" for up to 7 days) up to webhook_attempts,
    each delivery retried on its own; wrongly signed or unsigned posts are tried once unless attempts= says otherwise.
    Meta posts concurrently and promises no order: webhook_concurrency deliveries at once, each after a random
    delay of up to webhook_jitter s, so one number's messages reach the gateway in any order (their timestamps,
    whole seconds, say which was sent first). The fake's default is 1 and 0 (fake): one at a time, in order, so a
    delivery being retried holds back those behind it. Inbound media carry {"id", "mime_type", "sha256" (base64),
    "caption"?, "filename"? (document), "voice"? (audio)}; "unsupported" carries errors [131051]. Statuses {"id",
    "status", "timestamp", "recipient_id", "conversation"?, "pricing"?, "errors"? (failed)}: one per delivery
    unless batch=True, in any order asked.
  - GET /{phone_number_id}[?fields=a,b] -> {"id", "display_phone_number", "verified_name", "quality_rating",
    "code_verification_status"} (only the fields asked for, and id).
  - The GET handshake: hub.mode=subscribe, hub.verify_token, hub.challenge; expected: 200 + challenge, else 403.

Test-side controls (FakeWhatsApp's methods; FakeWhatsAppProcess's are the same, synchronous, except that its
message() returns {"payload", "wamid"}):
  message(from_, text, type=text|image|audio|document|video|sticker|unsupported, caption=, content=, mime_type=,
      filename=, size=, media_id=, context_id=, wamid=, timestamp=, name=, voice=, extra=, phone_number_id=,
      deliver=None: if subscribed) -> payload        statuses(wamid, [sent|delivered|read|failed..], order=None|
      "reverse"|"shuffle"|[indexes], errors=, recipient_id=, batch=, seed=, timestamp=, deliver=) -> [payloads]
  await deliver(url=None, payload, app_secret=None, wrong_signature=, unsigned=, duplicate=N, attempts=, wait=True)
      -> attempt records;  await verify(url=None, verify_token, challenge=None, mode=);  await drain(timeout=10)
  subscribe(url|None, app_secret, auto_statuses=());  add_media(content, mime_type=, filename=, size=) -> {"id",..}
  expire_media_urls(media_id=None);  script_error(code, times=1, to=None, on=send|read|upload|media|download|*,
      http_status=, message=, details=, subcode=) (500: HTTP 500, code 131000);  clear_errors();  scripted
  window(wa_id) / open_window(wa_id) / age_window(wa_id, seconds=None: past the window) / close_window(wa_id)
  set_rate_limit(pair_interval=None, per_second=None) -> 131056 / 130429;  configure(**SETTINGS);  pending()
  records(kind, since=None, **field filters), oldest first, "ts" = time.time(), kind in RECORD_KINDS: requests
      {method, path, status, code?, to?} | sent (see sent()) | reads {message_id, wa_id, typing} | uploads {id,
      mime_type, filename, size, sha256} | downloads {media_id, kind: info|content, status, expired?} |
      deliveries (see deliveries()) | injected {wamid, from, type};  sent(to=, since=), deliveries(since=)
  reset(): forget records, errors, limits, windows and queued deliveries (media and subscription stay)
Control endpoints, JSON (a bytes argument X travels as "X_b64"): GET /_control/health|errors|pending,
  GET|DELETE /_control/records/<kind>[?since=&<field>=..], DELETE /_control/errors, POST /_control/<action> with
  the method's keyword arguments, action in: messages ({"payload", "wamid"}) statuses deliver verify subscribe
  media errors window open_window age_window close_window rate_limit configure expire_media drain reset.
Tokens and app secrets are never recorded. Everything is bounded: records, media, URLs, queues, bodies, retries.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import functools
import base64
import hashlib
import hmac
import itertools
import json
import random
import secrets
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.fake_server import FakeServerProcess, listen, serve_until_stopped

API_VERSION = "v21.0"
DEFAULT_TOKEN = "EAAFakeWhatsAppCloudApiTokenForTests0123456789"
DEFAULT_APP_SECRET = "fake-whatsapp-app-secret"
DEFAULT_VERIFY_TOKEN = "fake-whatsapp-verify-token"
DEFAULT_PHONE_NUMBER_ID = "106540352242922"
DEFAULT_DISPLAY_NUMBER = "15550783881"
DEFAULT_WABA_ID = "102290129340398"
MAX_RECORDED = 5000
MAX_CONCURRENCY = 16  # webhook deliveries posted at once
MAX_MEDIA = 1000
MAX_URLS = 5000
MAX_KEYS = 100000
MAX_RULES = 1000
MAX_QUEUE = 10000
MAX_BODY = 64 * 1024 * 1024
MAX_TEXT = 4096
MAX_CAPTION = 1024
MEDIA_TTL = 300.0
WINDOW = 24 * 3600.0
WEBHOOK_TIMEOUT = 10.0
UPLOAD_LIMITS = {"image": 5 << 20, "audio": 16 << 20, "video": 16 << 20, "sticker": 500 << 10, "document": 100 << 20}
MEDIA_TYPES = ("image", "document", "audio", "video", "sticker")
SEND_TYPES = ("text", *MEDIA_TYPES, "template", "reaction")
DEFAULT_MIME = {"image": "image/jpeg", "document": "application/pdf", "audio": "audio/ogg; codecs=opus",
                "video": "video/mp4", "sticker": "image/webp"}
STATUSES = ("sent", "delivered", "read", "failed")
RECORD_KINDS = ("requests", "sent", "reads", "uploads", "downloads", "deliveries", "injected")
SCRIPT_ON = ("send", "read", "upload", "media", "download", "*")
SETTINGS: dict[str, Any] = {"media_ttl": MEDIA_TTL, "window": WINDOW, "enforce_window": True, "window_errors": "sync",
                            "templates": None, "strict_reads": True, "file_size_as_string": False,
                            "webhook_attempts": 20, "webhook_backoff": (0.05, 1.0), "webhook_concurrency": 1,
                            "webhook_jitter": 0.0}
ERROR_HREF = "https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes/"

# code: (HTTP status, title, details) as Meta's error-code table gives them
ERRORS: dict[int, tuple[int, str, str]] = {
    100: (400, "Invalid parameter", "The request included one or more unsupported or misspelled parameters."),
    190: (401, "Invalid OAuth access token - Cannot parse access token", ""),
    2500: (400, "An active access token must be used to query information about the current user.", ""),
    130429: (400, "Rate limit hit", "Cloud API message throughput has been reached."),
    131000: (500, "Something went wrong", "Message failed to send due to an unknown error."),
    131026: (400, "Message Undeliverable", "Message failed to send because the recipient is not a WhatsApp user,"
             " has not accepted the latest Terms of Service, or uses an old WhatsApp version."),
    131047: (400, "Re-engagement message", "Message failed to send because more than 24 hours have passed since"
             " the customer last replied to this number."),
    131051: (400, "Message type unknown", "Message type is not currently supported."),
    131053: (400, "Media upload error", "Unable to upload the media used in the message."),
    131056: (400, "(Business Account, Consumer Account) pair rate limit hit", "Message failed to send because"
             " there were too many messages sent from this phone number to the same phone number in a short"
             " period of time."),
    132001: (404, "Template name does not exist in the translation", "The template does not exist in the"
             " specified language or has not been approved."),
}
_SEQ = itertools.count(1)


class GraphError(Exception):
    """A Graph API error answer; `body()` is the envelope, `status` the HTTP status."""

    def __init__(self, code: int, message: str | None = None, *, http_status: int | None = None,
                 details: str | None = None, subcode: int | None = None) -> None:
        status, title, default_details = ERRORS.get(int(code), (400, f"Error {code}", ""))
        self.code = int(code)
        self.status = int(http_status or status)
        self.message = message or (title if self.code in (190, 2500) else f"(#{self.code}) {title}")
        self.details = default_details if details is None else details
        self.subcode = subcode
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        err: dict[str, Any] = {"message": self.message, "type": "OAuthException", "code": self.code}
        if self.subcode is not None:
            err["error_subcode"] = self.subcode
        if self.details:
            err["error_data"] = {"messaging_product": "whatsapp", "details": self.details}
        err["fbtrace_id"] = "A" + secrets.token_urlsafe(15)
        return {"error": err}


def _unsupported(method: str, obj: str) -> GraphError:
    return GraphError(100, f"Unsupported {method.lower()} request. Object with ID '{obj}' does not exist, cannot be"
                      " loaded due to missing permissions, or does not support this operation. Please read the"
                      " Graph API documentation at https://developers.facebook.com/docs/graph-api", subcode=33,
                      details="")


# --- payloads and signatures (plain functions: usable with no fake running) ------------------------------------


def wa_id_of(number: Any) -> str:
    """A phone number as WhatsApp's wa_id: its digits ("+1 650-555-1234" -> "16505551234")."""
    return "".join(c for c in str(number) if c.isdigit())


def new_wamid(seed: str = "") -> str:
    raw = f"{seed}:{next(_SEQ)}:{secrets.token_hex(6)}".encode()
    return "wamid." + base64.b64encode(raw).decode()


def error_object(code: int) -> dict[str, Any]:
    """An error as webhooks carry it: {"code", "title", "message", "error_data": {"details"}, "href"}."""
    _, title, details = ERRORS.get(int(code), (400, f"Error {code}", ""))
    return {"code": int(code), "title": title, "message": title, "error_data": {"details": details},
            "href": ERROR_HREF}


def envelope(value: dict[str, Any], waba_id: str = DEFAULT_WABA_ID) -> dict[str, Any]:
    return {"object": "whatsapp_business_account",
            "entry": [{"id": waba_id, "changes": [{"value": value, "field": "messages"}]}]}


def _value(phone_number_id: str, display_phone_number: str) -> dict[str, Any]:
    return {"messaging_product": "whatsapp",
            "metadata": {"display_phone_number": display_phone_number, "phone_number_id": phone_number_id}}


def message_payload(
    from_: str, text: str | None = None, *, type: str = "text", media_id: str | None = None,
    mime_type: str | None = None, sha256: str | None = None, caption: str | None = None,
    filename: str | None = None, voice: bool | None = None, context_id: str | None = None,
    context_from: str | None = None, wamid: str | None = None, timestamp: float | None = None,
    name: str | None = None, extra: dict[str, Any] | None = None, phone_number_id: str = DEFAULT_PHONE_NUMBER_ID,
    display_phone_number: str = DEFAULT_DISPLAY_NUMBER, waba_id: str = DEFAULT_WABA_ID,
) -> dict[str, Any]:
    """One inbound message as Meta posts it. `context_id` makes it a reply to that (business) message."""
    wa = wa_id_of(from_)
    msg: dict[str, Any] = {"from": wa, "id": wamid or new_wamid(wa),
                           "timestamp": str(int(time.time() if timestamp is None else timestamp)), "type": type}
    if context_id:
        msg["context"] = {"from": context_from or display_phone_number, "id": context_id}
    if type == "text":
        msg["text"] = {"body": text or ""}
    elif type in MEDIA_TYPES:
        body: dict[str, Any] = {"mime_type": mime_type or DEFAULT_MIME[type], "sha256": sha256 or "",
                                "id": media_id or ""}
        if caption is not None and type not in ("audio", "sticker"):
            body["caption"] = caption
        if type == "document":
            body["filename"] = filename or "file.pdf"
        if type == "audio":
            body["voice"] = True if voice is None else bool(voice)
        msg[type] = body
    elif type == "unsupported":
        msg["errors"] = [error_object(131051)]
    msg.update(extra or {})
    value = _value(phone_number_id, display_phone_number)
    value["contacts"] = [{"profile": {"name": name or f"User {wa[-4:]}"}, "wa_id": wa}]
    value["messages"] = [msg]
    return envelope(value, waba_id)


def status_object(wamid: str, status: str, recipient_id: str, *, timestamp: float | None = None,
                  errors: list[int | dict[str, Any]] | None = None) -> dict[str, Any]:
    """One entry of `statuses`: failed ones carry `errors` (codes become error objects; default 131026)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}")
    wa = wa_id_of(recipient_id)
    obj: dict[str, Any] = {"id": wamid, "status": status,
                           "timestamp": str(int(time.time() if timestamp is None else timestamp)), "recipient_id": wa}
    if status == "failed":
        obj["errors"] = [e if isinstance(e, dict) else error_object(int(e)) for e in (errors or [131026])]
    else:
        obj["conversation"] = {"id": hashlib.sha1(wa.encode()).hexdigest()[:32], "origin": {"type": "service"}}
        if status == "sent":
            obj["conversation"]["expiration_timestamp"] = str(int(time.time() + WINDOW))
        obj["pricing"] = {"billable": False, "pricing_model": "PMP", "category": "service"}
    return obj


def statuses_payload(objs: list[dict[str, Any]], *, phone_number_id: str = DEFAULT_PHONE_NUMBER_ID,
                     display_phone_number: str = DEFAULT_DISPLAY_NUMBER,
                     waba_id: str = DEFAULT_WABA_ID) -> dict[str, Any]:
    value = _value(phone_number_id, display_phone_number)
    value["statuses"] = list(objs)
    return envelope(value, waba_id)


def wamid_of(payload: dict[str, Any]) -> str:
    """The first message's (or status's) id in a webhook payload."""
    value = payload["entry"][0]["changes"][0]["value"]
    return (value.get("messages") or value.get("statuses"))[0]["id"]


def encode_body(payload: Any) -> bytes:
    """The raw webhook body: bytes/str as given, anything else JSON with non-ASCII escaped (as Meta signs it)."""
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode()
    return json.dumps(payload, ensure_ascii=True).encode()


def sign(body: bytes, app_secret: str) -> str:
    """The X-Hub-Signature-256 value: "sha256=" + hex HMAC-SHA256 of the raw body keyed by the app secret."""
    return "sha256=" + hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()


def webhook_headers(body: bytes, app_secret: str, *, wrong_signature: bool = False,
                    unsigned: bool = False) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "User-Agent": "facebookexternalua"}
    if not unsigned:
        key = app_secret + "-not-the-secret" if wrong_signature else app_secret
        headers["X-Hub-Signature-256"] = sign(body, key)
        headers["X-Hub-Signature"] = "sha1=" + hmac.new(key.encode(), body, hashlib.sha1).hexdigest()
    return headers


def describe(body: bytes) -> dict[str, Any]:
    """What a webhook body carries: {"kind": "messages"|"statuses"|"raw", "wamids", "statuses"}."""
    try:
        values = [c["value"] for e in json.loads(body)["entry"] for c in e["changes"]]
        msgs = [m["id"] for v in values for m in v.get("messages") or []]
        sts = [(s["id"], s["status"]) for v in values for s in v.get("statuses") or []]
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"kind": "raw", "wamids": [], "statuses": []}
    kind = "messages" if msgs else "statuses" if sts else "raw"
    return {"kind": kind, "wamids": msgs + [i for i, _ in sts], "statuses": [st for _, st in sts]}


def _attempts(attempts: int | None, default: int, wrong_signature: bool, unsigned: bool) -> int:
    if attempts is None:
        return 1 if (wrong_signature or unsigned) else default
    if not 1 <= int(attempts) <= 100:
        raise ValueError("attempts must be 1..100")
    return int(attempts)


def post_webhook(url: str, payload: Any, app_secret: str = DEFAULT_APP_SECRET, *, wrong_signature: bool = False,
                 unsigned: bool = False, duplicate: int = 0, attempts: int | None = None,
                 backoff: tuple[float, float] = (0.05, 0.5), timeout: float = WEBHOOK_TIMEOUT,
                 on_attempt: Any = None, stop: threading.Event | None = None) -> list[dict[str, Any]]:
    """Post a webhook synchronously like Meta: signed, retried on non-2xx or no answer (up to `attempts`, with
    exponential `backoff`), then `duplicate` more identical copies. Returns one record per attempt {"url", "kind",
    "wamids", "statuses", "signature", "copy", "attempt", "status", "error", "elapsed", "ts"}, each also passed to
    on_attempt as it happens; `stop` ends the retries."""
    body = encode_body(payload)
    headers = webhook_headers(body, app_secret, wrong_signature=wrong_signature, unsigned=unsigned)
    tries = _attempts(attempts, 5, wrong_signature, unsigned)
    info = {**describe(body), "url": url, "signature": "none" if unsigned else "wrong" if wrong_signature else "valid"}
    stop = stop or threading.Event()
    out: list[dict[str, Any]] = []
    for copy in range(int(duplicate) + 1):
        for attempt in range(1, tries + 1):
            status, error, t0 = 0, "", time.monotonic()
            req = urllib.request.Request(url, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    status = resp.status
                    resp.read()
            except urllib.error.HTTPError as e:
                status = e.code
                e.read()
            except (urllib.error.URLError, OSError) as e:
                error = type(e).__name__
            rec = {**info, "copy": copy, "attempt": attempt, "status": status, "error": error,
                   "elapsed": round(time.monotonic() - t0, 4), "ts": time.time()}
            out.append(rec)
            if on_attempt is not None:
                on_attempt(rec)
            if 200 <= status < 300 or attempt == tries or stop.wait(min(backoff[1], backoff[0] * 2 ** (attempt - 1))):
                break
    return out


def verify_webhook(url: str, verify_token: str = DEFAULT_VERIFY_TOKEN, challenge: str | None = None,
                   mode: str = "subscribe", timeout: float = WEBHOOK_TIMEOUT) -> dict[str, Any]:
    """Meta's GET handshake, synchronously: {"status" (0: no answer), "body", "challenge"}."""
    challenge = challenge or str(random.randint(10**8, 10**9))
    q = urllib.parse.urlencode({"hub.mode": mode, "hub.challenge": challenge, "hub.verify_token": verify_token})
    status, body = 0, b""
    try:
        with urllib.request.urlopen(url + ("&" if "?" in url else "?") + q, timeout=timeout) as resp:
            status, body = resp.status, resp.read(1000)
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read(1000)
    except (urllib.error.URLError, OSError):
        pass
    return {"status": status, "body": body.decode(errors="replace"), "challenge": challenge}


def _put(d: dict[Any, Any], key: Any, value: Any, cap: int) -> None:
    d.pop(key, None)
    d[key] = value
    while len(d) > cap:
        del d[next(iter(d))]


def _media_kind(mime: str) -> str:
    major = mime.split("/", 1)[0].lower()
    if mime.lower() == "image/webp":
        return "sticker"
    return major if major in ("image", "audio", "video") else "document"


# --- the fake ---------------------------------------------------------------------------------------------------


class FakeWhatsApp:
    """The fake Cloud API in the current event loop; `async with` starts and stops it."""

    def __init__(self, *, tokens: list[str] | tuple[str, ...] = (DEFAULT_TOKEN,),
                 numbers: dict[str, str] | None = None, waba_id: str = DEFAULT_WABA_ID, host: str = "127.0.0.1",
                 port: int = 0, **settings: Any) -> None:
        """numbers: {phone_number_id: display_phone_number}; settings: configure()'s (SETTINGS are the defaults)."""
        if not tokens:
            raise ValueError("at least one token")
        self.tokens, self.waba_id, self.host, self.port = list(tokens), waba_id, host, port
        self.numbers = dict(numbers or {DEFAULT_PHONE_NUMBER_ID: DEFAULT_DISPLAY_NUMBER})
        self.configure(**{**SETTINGS, **settings})
        self._rec: dict[str, deque[dict[str, Any]]] = {k: deque(maxlen=MAX_RECORDED) for k in RECORD_KINDS}
        self._media: dict[str, dict[str, Any]] = {}
        self._urls: dict[str, list[Any]] = {}  # hash -> [media_id, expires (time.time())]
        self._window: dict[tuple[str, str], float] = {}  # (phone_number_id, wa_id) -> last inbound time
        self._inbound: dict[str, tuple[str, str]] = {}  # wamid -> (phone_number_id, wa_id)
        self._sent_by_id: dict[str, dict[str, Any]] = {}
        self._rules: list[dict[str, Any]] = []
        self._pair_interval: float | None = None
        self._per_second: int | None = None
        self._last_send: dict[tuple[str, str], float] = {}
        self._recent: dict[str, deque[float]] = {}
        self._sub: dict[str, Any] | None = None
        self._queue: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue(MAX_QUEUE)
        self._busy = 0
        self._workers: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._stop = threading.Event()
        # its own threads for the blocking posts, as many as deliveries may run at once (asyncio.to_thread's
        # default pool has min(32, cores + 4): 6 here, which would queue a 16-wide delivery behind itself)
        self._posters: concurrent.futures.ThreadPoolExecutor | None = None

    # --- lifecycle ---

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        """In place of https://graph.facebook.com/v21.0."""
        return f"{self.url}/{API_VERSION}"

    @property
    def token(self) -> str:
        return self.tokens[0]

    @property
    def phone_number_id(self) -> str:
        return next(iter(self.numbers))

    async def start(self) -> FakeWhatsApp:
        self._stop.clear()
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([
            web.route("*", r"/{ver:v[0-9]+\.[0-9]+}/{path:.*}", self._graph),
            web.get("/whatsapp_business/attachments/", self._cdn),
            web.route("*", "/_control/{what:.+}", self._control),
        ])
        self._runner, self.port = await listen(app, self.host, self.port)
        self._loop = asyncio.get_running_loop()
        self._posters = concurrent.futures.ThreadPoolExecutor(max_workers=MAX_CONCURRENCY, thread_name_prefix="webhook")
        self._spawn()
        return self

    async def stop(self) -> None:
        self._stop.set()  # ends retries in flight
        self._loop = None
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        if self._posters is not None:
            posters, self._posters = self._posters, None
            posters.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> FakeWhatsApp:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def configure(self, **kw: Any) -> dict[str, Any]:
        """Change any of SETTINGS: media_ttl, window (s), enforce_window, window_errors ("sync" | "webhook"),
        templates (None: any name), strict_reads, file_size_as_string, webhook_attempts, webhook_backoff (first,
        max s), webhook_concurrency (queued deliveries posted at once; 1 keeps them in order), webhook_jitter (each
        queued delivery waits a random 0..this many s before it is posted: with concurrency, out of order)."""
        if set(kw) - set(SETTINGS):
            raise ValueError(f"unknown settings {sorted(set(kw) - set(SETTINGS))}; known: {sorted(SETTINGS)}")
        if kw.get("window_errors", "sync") not in ("sync", "webhook"):
            raise ValueError("window_errors must be 'sync' or 'webhook'")
        if not 1 <= int(kw.get("webhook_attempts", 1)) <= 100:
            raise ValueError("webhook_attempts must be 1..100")
        if not 1 <= int(kw.get("webhook_concurrency", 1)) <= MAX_CONCURRENCY:
            raise ValueError(f"webhook_concurrency must be 1..{MAX_CONCURRENCY}")
        if not 0 <= float(kw.get("webhook_jitter", 0)) <= 10:
            raise ValueError("webhook_jitter must be 0..10 s")
        for key, value in kw.items():
            if key == "templates" and value is not None:
                value = set(value)
            elif key == "webhook_backoff":
                value = (float(value[0]), float(value[1]))
            setattr(self, "window_s" if key == "window" else key, value)
        return {"ok": True}

    # --- numbers, windows, media ---

    def _number(self, phone_number_id: str | None) -> str:
        if phone_number_id is None:
            return self.phone_number_id
        if str(phone_number_id) not in self.numbers:
            raise ValueError(f"no such phone number id {phone_number_id!r}")
        return str(phone_number_id)

    def window(self, wa_id: str, phone_number_id: str | None = None) -> dict[str, Any]:
        """{"wa_id", "last_inbound" (time.time() or None), "open", "closes_at"}."""
        wa = wa_id_of(wa_id)
        last = self._window.get((self._number(phone_number_id), wa))
        closes = None if last is None else last + self.window_s
        return {"wa_id": wa, "last_inbound": last, "open": closes is not None and time.time() < closes,
                "closes_at": closes}

    def open_window(self, wa_id: str, phone_number_id: str | None = None) -> dict[str, Any]:
        """As if wa_id wrote just now (no webhook)."""
        _put(self._window, (self._number(phone_number_id), wa_id_of(wa_id)), time.time(), MAX_KEYS)
        return self.window(wa_id, phone_number_id)

    def age_window(self, wa_id: str, seconds: float | None = None,
                   phone_number_id: str | None = None) -> dict[str, Any]:
        """Move wa_id's last inbound message `seconds` into the past (None: just past the window, closing it)."""
        key = (self._number(phone_number_id), wa_id_of(wa_id))
        shift = self.window_s + 1 if seconds is None else float(seconds)
        _put(self._window, key, self._window.get(key, time.time()) - shift, MAX_KEYS)
        return self.window(wa_id, phone_number_id)

    def close_window(self, wa_id: str, phone_number_id: str | None = None) -> dict[str, Any]:
        """Forget wa_id's messages: as if they never wrote."""
        self._window.pop((self._number(phone_number_id), wa_id_of(wa_id)), None)
        return self.window(wa_id, phone_number_id)

    def add_media(self, content: bytes, *, mime_type: str = "image/jpeg", filename: str | None = None,
                  size: int | None = None) -> dict[str, Any]:
        """Media the API can GET and download; `size` overrides the reported file_size (a big claim without the
        bytes). Returns {"id", "mime_type", "sha256" (hex), "file_size", "filename"}."""
        if len(content) > MAX_BODY:
            raise ValueError(f"media over {MAX_BODY} bytes")
        mid = str(10**15 + next(_SEQ) * 7919 + random.randint(0, 7918))
        info = {"id": mid, "mime_type": mime_type, "sha256": hashlib.sha256(content).hexdigest(),
                "file_size": int(len(content) if size is None else size), "filename": filename}
        _put(self._media, mid, {**info, "content": bytes(content)}, MAX_MEDIA)
        return info

    def expire_media_urls(self, media_id: str | None = None) -> dict[str, Any]:
        """Every URL issued so far (for media_id, or all) is expired from now on."""
        n = 0
        for entry in self._urls.values():
            if media_id is None or entry[0] == str(media_id):
                entry[1] = 0.0
                n += 1
        return {"expired": n}

    # --- scripting ---

    def script_error(self, code: int, *, times: int = 1, to: str | None = None, on: str = "send",
                     http_status: int | None = None, message: str | None = None, details: str | None = None,
                     subcode: int | None = None) -> dict[str, Any]:
        """The next `times` matching calls (to recipient `to` only, when given) fail with Graph error `code`
        (500: HTTP 500 with 131000). on: send | read | upload | media (GET /{id}) | download | *."""
        if on not in SCRIPT_ON:
            raise ValueError(f"on must be one of {SCRIPT_ON}")
        if not 1 <= int(times) <= 10000:
            raise ValueError("times must be 1..10000")
        if len(self._rules) >= MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} scripted errors")
        code = int(code)
        if code == 500:
            code, http_status = 131000, http_status or 500
        rule = {"code": code, "times": int(times), "to": None if to is None else wa_id_of(to), "on": on,
                "http_status": http_status, "message": message, "details": details, "subcode": subcode}
        self._rules.append(rule)
        return dict(rule)

    @property
    def scripted(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rules]

    def clear_errors(self) -> None:
        self._rules.clear()

    def set_rate_limit(self, pair_interval: float | None = None, per_second: int | None = None) -> None:
        """From now on a send to one recipient within pair_interval s of the last is 131056, and sends beyond
        per_second in one second from one number are 130429. None switches a limit off."""
        self._pair_interval = None if pair_interval is None else float(pair_interval)
        self._per_second = None if per_second is None else int(per_second)

    def _scripted(self, on: str, wa: str | None) -> None:
        for i, r in enumerate(self._rules):
            if r["on"] not in ("*", on) or (r["to"] is not None and r["to"] != wa):
                continue
            r["times"] -= 1
            if r["times"] <= 0:
                del self._rules[i]
            raise GraphError(r["code"], r["message"], http_status=r["http_status"], details=r["details"],
                             subcode=r["subcode"])

    # --- inbound: messages and statuses ---

    def message(
        self, from_: str, text: str | None = None, *, type: str = "text", caption: str | None = None,
        content: bytes | None = None, mime_type: str | None = None, filename: str | None = None,
        size: int | None = None, media_id: str | None = None, context_id: str | None = None,
        wamid: str | None = None, timestamp: float | None = None, name: str | None = None, voice: bool | None = None,
        extra: dict[str, Any] | None = None, phone_number_id: str | None = None, deliver: bool | None = None,
    ) -> dict[str, Any]:
        """An inbound message from `from_`: its payload (wamid_of(payload) is its id). Media types get a media
        object the gateway can fetch (content defaults to a few bytes). The sender's window opens at its
        timestamp. deliver: True posts it to the subscription, None only if there is one, False never."""
        pnid = self._number(phone_number_id)
        sha = None
        if type in MEDIA_TYPES:
            if media_id is None:
                data = content if content is not None else f"fake {type} content".encode()
                media_id = self.add_media(data, mime_type=mime_type or DEFAULT_MIME[type], filename=filename,
                                          size=size)["id"]
            m = self._media.get(str(media_id))
            if m is not None:
                sha = base64.b64encode(bytes.fromhex(m["sha256"])).decode()
                mime_type = mime_type or m["mime_type"]
        payload = message_payload(
            from_, text, type=type, media_id=media_id, mime_type=mime_type, sha256=sha, caption=caption,
            filename=filename, voice=voice, context_id=context_id, wamid=wamid, timestamp=timestamp, name=name,
            extra=extra, phone_number_id=pnid, display_phone_number=self.numbers[pnid], waba_id=self.waba_id,
        )
        msg = payload["entry"][0]["changes"][0]["value"]["messages"][0]
        key = (pnid, msg["from"])
        _put(self._window, key, max(self._window.get(key, 0.0), float(msg["timestamp"])), MAX_KEYS)
        _put(self._inbound, msg["id"], key, MAX_KEYS)
        self._rec["injected"].append({"wamid": msg["id"], "from": msg["from"], "type": type,
                                      "phone_number_id": pnid, "ts": time.time()})
        self._maybe_deliver(payload, deliver)
        return payload

    def statuses(
        self, wamid: str, statuses: list[str] | tuple[str, ...] | str = ("sent", "delivered", "read"), *,
        order: str | list[int] | None = None, errors: list[int | dict[str, Any]] | None = None,
        recipient_id: str | None = None, batch: bool = False, seed: int = 0, timestamp: float | None = None,
        phone_number_id: str | None = None, deliver: bool | None = None,
    ) -> list[dict[str, Any]]:
        """Status callbacks for a message the fake sent (or any wamid, with recipient_id): one payload per status
        (batch=True: one for all), in the order given, reversed, shuffled (seed) or picked by index (so some can
        be skipped or repeated). Delivered like message()."""
        if isinstance(statuses, str):
            statuses = [statuses]
        sent = self._sent_by_id.get(wamid)
        if recipient_id is None:
            if sent is None:
                raise ValueError(f"the fake never sent {wamid!r}: give recipient_id")
            recipient_id = sent["wa_id"]
        pnid = self._number(phone_number_id or (sent or {}).get("phone_number_id"))
        objs = [status_object(wamid, s, recipient_id, timestamp=timestamp, errors=errors) for s in statuses]
        if order == "reverse":
            objs.reverse()
        elif order == "shuffle":
            random.Random(seed).shuffle(objs)
        elif isinstance(order, list):
            objs = [objs[int(i)] for i in order]
        elif order is not None:
            raise ValueError("order must be None, 'reverse', 'shuffle' or a list of indexes")
        kw = {"phone_number_id": pnid, "display_phone_number": self.numbers[pnid], "waba_id": self.waba_id}
        payloads = [statuses_payload(objs, **kw)] if batch else [statuses_payload([o], **kw) for o in objs]
        for p in payloads:
            self._maybe_deliver(p, deliver)
        return payloads

    # --- webhook delivery ---

    def subscribe(self, url: str | None, app_secret: str = DEFAULT_APP_SECRET, *,
                  auto_statuses: list[str] | tuple[str, ...] = ()) -> None:
        """Where message()/statuses() deliver by default (None: nowhere). auto_statuses: posted after every
        accepted send, e.g. ("sent", "delivered")."""
        for s in auto_statuses:
            if s not in STATUSES:
                raise ValueError(f"status must be one of {STATUSES}")
        self._sub = None if url is None else {"url": str(url), "app_secret": str(app_secret),
                                                "auto_statuses": list(auto_statuses)}

    def _target(self, url: str | None, app_secret: str | None) -> tuple[str, str]:
        sub = self._sub or {}
        url = url or sub.get("url")
        if not url:
            raise ValueError("no url given and no subscription")
        return url, app_secret or sub.get("app_secret") or DEFAULT_APP_SECRET

    def _maybe_deliver(self, payload: Any, deliver: bool | None) -> None:
        if deliver is False or (deliver is None and self._sub is None):
            return
        url, secret = self._target(None, None)
        self._enqueue((url, encode_body(payload), secret, False, False, 0, None))

    def _enqueue(self, item: tuple[Any, ...]) -> None:
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            raise ValueError(f"at most {MAX_QUEUE} queued deliveries") from None
        self._spawn()

    def _spawn(self) -> None:
        while self._loop is not None and len(self._workers) < int(self.webhook_concurrency):
            self._workers.append(self._loop.create_task(self._work()))

    async def deliver(self, url: str | None = None, payload: Any = None, app_secret: str | None = None, *,
                      wrong_signature: bool = False, unsigned: bool = False, duplicate: int = 0,
                      attempts: int | None = None, wait: bool = True) -> list[dict[str, Any]]:
        """Post `payload` (dict, or raw bytes/str) to url (default: the subscription), signed with app_secret
        (default: the subscription's), retried like Meta, then `duplicate` more identical copies. wait=False
        queues it behind the other deliveries (FIFO, one at a time) and returns []."""
        url, secret = self._target(url, app_secret)
        if not 0 <= int(duplicate) <= 100:
            raise ValueError("duplicate must be 0..100")
        item = (url, encode_body(payload), secret, wrong_signature, unsigned, int(duplicate), attempts)
        _attempts(attempts, 1, wrong_signature, unsigned)  # validates
        if not wait:
            self._enqueue(item)
            return []
        return await self._post(*item)

    async def _post(self, url: str, body: bytes, secret: str, wrong_signature: bool, unsigned: bool,
                    duplicate: int, attempts: int | None) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()

        def record(rec: dict[str, Any]) -> None:  # from the posting thread: the deque is read in the loop
            try:
                loop.call_soon_threadsafe(self._rec["deliveries"].append, rec)
            except RuntimeError:  # the loop is gone
                pass

        return await loop.run_in_executor(self._posters, functools.partial(
            post_webhook, url, body, secret, wrong_signature=wrong_signature, unsigned=unsigned, duplicate=duplicate,
            attempts=attempts if attempts is not None or wrong_signature or unsigned else self.webhook_attempts,
            backoff=self.webhook_backoff, on_attempt=record, stop=self._stop))

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            self._busy += 1
            try:
                if self.webhook_jitter:  # a later delivery may overtake this one (on another worker)
                    await asyncio.sleep(random.uniform(0, float(self.webhook_jitter)))
                await self._post(*item)
            finally:
                self._busy -= 1
                self._queue.task_done()

    def pending(self) -> int:
        """Deliveries queued or in flight."""
        return self._queue.qsize() + self._busy

    async def drain(self, timeout: float = 10.0) -> dict[str, Any]:
        """Wait (bounded) until every queued delivery was made or given up."""
        try:
            await asyncio.wait_for(self._queue.join(), max(0.0, min(float(timeout), 600.0)))
        except TimeoutError:
            pass
        return {"pending": self.pending()}

    async def verify(self, url: str | None = None, verify_token: str = DEFAULT_VERIFY_TOKEN,
                     challenge: str | None = None, mode: str = "subscribe") -> dict[str, Any]:
        """Meta's GET handshake: {"status", "body", "challenge"} (also recorded as a "verify" delivery)."""
        url, _ = self._target(url, None)
        got = await asyncio.to_thread(verify_webhook, url, verify_token, challenge, mode)
        self._rec["deliveries"].append({"kind": "verify", "url": url, "status": got["status"], "ts": time.time()})
        return got

    # --- reading what happened ---

    def records(self, kind: str, /, since: float | None = None, **filters: Any) -> list[dict[str, Any]]:
        if kind not in self._rec:
            raise ValueError(f"kind must be one of {RECORD_KINDS}")
        return [dict(r) for r in self._rec[kind] if (since is None or r["ts"] >= float(since))
                and all(str(r.get(k)) == str(v) for k, v in filters.items() if v is not None)]

    def sent(self, to: str | None = None, since: float | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Accepted messages: {"id", "phone_number_id", "to", "wa_id", "type", "text", "caption", "media_id",
        "link", "filename", "template", "language", "context", "failed", "ts", ...}."""
        return self.records("sent", since, wa_id=None if to is None else wa_id_of(to), **filters)

    def deliveries(self, since: float | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Webhook posts: {"url", "kind", "wamids", "statuses", "signature", "copy", "attempt", "status", "error",
        "elapsed", "ts"} (and {"kind": "verify", "url", "status", "ts"})."""
        return self.records("deliveries", since, **filters)

    def clear(self, kind: str) -> None:
        self.records(kind)  # validates
        self._rec[kind].clear()

    def reset(self) -> None:
        for d in self._rec.values():
            d.clear()
        self._rules.clear()
        self._window.clear()
        self._inbound.clear()
        self._sent_by_id.clear()
        self._last_send.clear()
        self._recent.clear()
        self._pair_interval = self._per_second = None
        while not self._queue.empty():
            self._queue.get_nowait()
            self._queue.task_done()

    # --- the Graph API ---

    def _token_ok(self, request: web.Request) -> str | None:
        auth = request.headers.get("Authorization", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else request.query.get("access_token", "")
        if not token:
            return None
        return "ok" if token in self.tokens else "wrong"

    async def _graph(self, request: web.Request) -> web.Response:
        path = request.match_info["path"].strip("/")
        rec: dict[str, Any] = {"method": request.method, "path": f"/{request.match_info['ver']}/{path}",
                               "ts": time.time()}
        self._rec["requests"].append(rec)
        try:
            auth = self._token_ok(request)
            if auth is None:
                raise GraphError(2500)
            if auth == "wrong":
                raise GraphError(190)
            result = await self._route(request, request.method, path.split("/") if path else [], rec)
        except GraphError as e:
            rec.update(status=e.status, code=e.code)
            return web.json_response(e.body(), status=e.status)
        rec["status"] = 200
        return web.json_response(result)

    async def _route(self, request: web.Request, method: str, parts: list[str], rec: dict[str, Any]) -> Any:
        if len(parts) == 2 and method == "POST" and parts[1] in ("messages", "media"):
            if parts[0] not in self.numbers:
                raise _unsupported(method, parts[0])
            if parts[1] == "messages":
                return self._messages(parts[0], await _json_body(request), rec)
            return await self._upload(parts[0], request)
        if len(parts) == 1 and method == "GET" and parts[0] in self.numbers:  # a business number's own fields
            number = {"id": parts[0], "display_phone_number": self.numbers[parts[0]], "verified_name": "Fake Business",
                      "quality_rating": "GREEN", "code_verification_status": "VERIFIED"}
            fields = request.query.get("fields")
            return {k: v for k, v in number.items() if not fields or k == "id" or k in fields.split(",")}
        if len(parts) == 1 and method in ("GET", "DELETE"):
            self._scripted("media", None)
            m = self._media.get(parts[0])
            if m is None:
                raise _unsupported(method, parts[0])
            if method == "DELETE":
                del self._media[parts[0]]
                return {"success": True}
            return self._media_info(m)
        raise _unsupported(method, parts[0] if parts else "")

    def _messages(self, pnid: str, body: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
        if body.get("messaging_product") != "whatsapp":
            raise GraphError(100, "(#100) The parameter messaging_product is required.")
        if "status" in body:
            return self._read_receipt(pnid, body, rec)
        to = body.get("to")
        wa = wa_id_of(to) if isinstance(to, (str, int)) else ""
        if not wa:
            raise GraphError(100, "(#100) The parameter to is required.")
        rec["to"] = wa
        self._scripted("send", wa)
        mtype = body.get("type", "text")
        content = self._content(mtype, body)
        ctx = body.get("context")
        if ctx is not None and not (isinstance(ctx, dict) and isinstance(ctx.get("message_id"), str)):
            raise GraphError(100, details="Param context['message_id'] must be a message id.")
        self._rate_check(pnid, wa)
        failed = None
        if mtype != "template" and self.enforce_window and not self.window(wa, pnid)["open"]:
            if self.window_errors == "sync":
                raise GraphError(131047)
            failed = 131047
        wamid = new_wamid(wa)
        now = time.monotonic()
        _put(self._last_send, (pnid, wa), now, MAX_KEYS)
        self._recent.setdefault(pnid, deque(maxlen=10000)).append(now)
        record = {"id": wamid, "phone_number_id": pnid, "to": str(to), "wa_id": wa, "type": mtype, **content,
                  "context": ctx["message_id"] if ctx else None, "failed": failed, "ts": time.time()}
        self._rec["sent"].append(record)
        _put(self._sent_by_id, wamid, record, MAX_RECORDED)
        if failed is not None:
            self.statuses(wamid, ["failed"], errors=[failed])
        elif self._sub and self._sub["auto_statuses"]:
            self.statuses(wamid, self._sub["auto_statuses"])
        msg: dict[str, Any] = {"id": wamid}
        if mtype == "template":
            msg["message_status"] = "accepted"
        return {"messaging_product": "whatsapp", "contacts": [{"input": str(to), "wa_id": wa}], "messages": [msg]}

    def _content(self, mtype: Any, body: dict[str, Any]) -> dict[str, Any]:
        if mtype not in SEND_TYPES:
            raise GraphError(100, details=f"Param type must be one of {', '.join(SEND_TYPES)}.")
        obj = body.get(mtype)
        if not isinstance(obj, dict):
            raise GraphError(100, f"(#100) The parameter {mtype} is required.")
        out: dict[str, Any] = {"text": None}
        if mtype == "text":
            text = obj.get("body")
            if not isinstance(text, str) or not text:
                raise GraphError(100, "(#100) The parameter text['body'] is required.")
            if len(text) > MAX_TEXT:
                raise GraphError(100, details=f"Param text['body'] must be at most {MAX_TEXT} characters long.")
            return {"text": text, "preview_url": bool(obj.get("preview_url", False))}
        if mtype in MEDIA_TYPES:
            mid, link, caption = obj.get("id"), obj.get("link"), obj.get("caption")
            if (mid is None) == (link is None):
                raise GraphError(100, details=f"Param {mtype} must have exactly one of 'id' and 'link'.")
            if mid is not None and str(mid) not in self._media:
                raise GraphError(100, details=f"Param {mtype}['id'] is not a valid media id.")
            if link is not None and not str(link).startswith(("http://", "https://")):
                raise GraphError(100, details=f"Param {mtype}['link'] must be a valid URL.")
            if caption is not None and mtype in ("audio", "sticker"):
                raise GraphError(100, details=f"Param {mtype}['caption'] is not a valid parameter.")
            if caption is not None and len(str(caption)) > MAX_CAPTION:
                raise GraphError(100, details=f"Param {mtype}['caption'] must be at most {MAX_CAPTION} characters"
                                 " long.")
            return {**out, "media_id": None if mid is None else str(mid), "link": link, "caption": caption,
                    "filename": obj.get("filename")}
        if mtype == "template":
            name, lang = obj.get("name"), obj.get("language")
            code = lang.get("code") if isinstance(lang, dict) else None
            if not isinstance(name, str) or not name or not isinstance(code, str) or not code:
                raise GraphError(100, details="Param template['name'] and template['language']['code'] are"
                                 " required.")
            if self.templates is not None and name not in self.templates:
                raise GraphError(132001)
            return {**out, "template": name, "language": code, "components": obj.get("components")}
        return {**out, "reaction_to": obj.get("message_id"), "emoji": obj.get("emoji")}

    def _rate_check(self, pnid: str, wa: str) -> None:
        now = time.monotonic()
        if self._pair_interval is not None:
            last = self._last_send.get((pnid, wa))
            if last is not None and now - last < self._pair_interval:
                raise GraphError(131056)
        if self._per_second is not None:
            recent = self._recent.get(pnid) or deque()
            if sum(1 for t in recent if now - t < 1.0) >= self._per_second:
                raise GraphError(130429)

    def _read_receipt(self, pnid: str, body: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
        if body.get("status") != "read":
            raise GraphError(100, details="Param status must be 'read'.")
        mid = body.get("message_id")
        if not isinstance(mid, str) or not mid:
            raise GraphError(100, "(#100) The parameter message_id is required.")
        known = self._inbound.get(mid)
        rec["read"] = mid
        self._scripted("read", known[1] if known else None)
        if known is None and self.strict_reads:
            raise GraphError(100, details=f"Param message_id '{mid[:80]}' is not a message this number received.")
        typing = body.get("typing_indicator")
        if typing is not None and typing != {"type": "text"}:
            raise GraphError(100, details="Param typing_indicator['type'] must be 'text'.")
        self._rec["reads"].append({"message_id": mid, "wa_id": known[1] if known else None, "phone_number_id": pnid,
                                   "typing": typing is not None, "ts": time.time()})
        return {"success": True}

    async def _upload(self, pnid: str, request: web.Request) -> dict[str, Any]:
        if request.content_type != "multipart/form-data":
            raise GraphError(100, details="Media upload must be multipart/form-data.")
        fields: dict[str, str] = {}
        file: dict[str, Any] | None = None
        async for part in await request.multipart():
            if not isinstance(part, aiohttp.BodyPartReader) or part.name is None:
                continue
            data = bytearray()
            while chunk := await part.read_chunk():
                data += chunk
                if len(data) > MAX_BODY:
                    raise GraphError(131053, details=f"Media over the fake's {MAX_BODY} byte cap.")
            if part.filename is not None:
                file = {"content": bytes(data), "filename": part.filename,
                        "content_type": part.headers.get("Content-Type")}
            else:
                fields[part.name] = data.decode("utf-8", "replace")
        if fields.get("messaging_product") != "whatsapp":
            raise GraphError(100, "(#100) The parameter messaging_product is required.")
        if file is None:
            raise GraphError(100, "(#100) The parameter file is required.")
        mime = fields.get("type") or file["content_type"]
        if not mime:
            raise GraphError(100, "(#100) The parameter type is required.")
        self._scripted("upload", None)
        kind = _media_kind(mime)
        if len(file["content"]) > UPLOAD_LIMITS[kind]:
            raise GraphError(131053, details=f"Media file size {len(file['content'])} is over the {kind} limit of"
                             f" {UPLOAD_LIMITS[kind]} bytes.")
        m = self.add_media(file["content"], mime_type=mime, filename=file["filename"])
        self._rec["uploads"].append({"id": m["id"], "phone_number_id": pnid, "mime_type": mime,
                                     "filename": file["filename"], "size": m["file_size"], "sha256": m["sha256"],
                                     "ts": time.time()})
        return {"id": m["id"]}

    def _media_info(self, m: dict[str, Any]) -> dict[str, Any]:
        token = secrets.token_urlsafe(18)
        expires = time.time() + float(self.media_ttl)
        _put(self._urls, token, [m["id"], expires], MAX_URLS)
        q = urllib.parse.urlencode({"mid": m["id"], "ext": int(expires), "hash": token})
        self._rec["downloads"].append({"media_id": m["id"], "kind": "info", "status": 200, "ts": time.time()})
        size = str(m["file_size"]) if self.file_size_as_string else m["file_size"]
        return {"messaging_product": "whatsapp", "url": f"{self.url}/whatsapp_business/attachments/?{q}",
                "mime_type": m["mime_type"], "sha256": m["sha256"], "file_size": size, "id": m["id"]}

    async def _cdn(self, request: web.Request) -> web.Response:
        mid, token = request.query.get("mid", ""), request.query.get("hash", "")
        rec: dict[str, Any] = {"media_id": mid, "kind": "content", "ts": time.time()}
        self._rec["downloads"].append(rec)
        entry = self._urls.get(token)
        if self._token_ok(request) != "ok":
            rec["status"] = 401
            return web.Response(status=401, text="Unauthorized")
        try:
            self._scripted("download", None)
        except GraphError as e:
            rec["status"] = e.status
            return web.json_response(e.body(), status=e.status)
        if entry is None or entry[0] != mid or mid not in self._media:
            rec["status"] = 404
            return web.Response(status=404, text="Not Found")
        if time.time() >= entry[1]:
            rec.update(status=404, expired=True)
            return web.Response(status=404, text="URL signature expired")
        m = self._media[mid]
        rec["status"] = 200
        return web.Response(body=m["content"], content_type=m["mime_type"].split(";")[0].strip())

    # --- control ---

    async def _control(self, request: web.Request) -> web.Response:
        what, method, q = request.match_info["what"], request.method, dict(request.query)
        fn: Any = None
        if what.startswith("records/") and method in ("GET", "DELETE"):
            kind, since = what[8:], q.pop("since", None)
            fn = (lambda d: self.records(kind, since=since, **q)) if method == "GET" else (
                lambda d: self.clear(kind) or {"ok": True})
        elif method == "GET":
            fn = {"health": lambda d: {"ok": True}, "errors": lambda d: self.scripted,
                  "pending": lambda d: {"pending": self.pending()}}.get(what)
        elif method == "DELETE" and what == "errors":
            fn = lambda d: self.clear_errors() or {"ok": True}
        elif method == "POST":
            fn = {
                "messages": lambda d: {"payload": (p := self.message(**d)), "wamid": wamid_of(p)},
                "statuses": lambda d: self.statuses(**d),
                "deliver": lambda d: self.deliver(**d),
                "verify": lambda d: self.verify(**d),
                "subscribe": lambda d: self.subscribe(**d) or {"ok": True},
                "media": lambda d: self.add_media(**d),
                "errors": lambda d: self.script_error(**d),
                "window": lambda d: self.window(**d),
                "open_window": lambda d: self.open_window(**d),
                "age_window": lambda d: self.age_window(**d),
                "close_window": lambda d: self.close_window(**d),
                "rate_limit": lambda d: self.set_rate_limit(**d) or {"ok": True},
                "configure": lambda d: self.configure(**d),
                "expire_media": lambda d: self.expire_media_urls(d.get("media_id")),
                "drain": lambda d: self.drain(**d),
                "reset": lambda d: self.reset() or {"ok": True},
            }.get(what)
        if fn is None:
            return web.json_response({"error": f"no control endpoint {method} /_control/{what}"}, status=404)
        return await _control(request, fn, body=method == "POST")


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.read() or b"{}")
    except ValueError:
        raise GraphError(100, details="The request body is not valid JSON.") from None
    if not isinstance(body, dict):
        raise GraphError(100, details="The request body must be a JSON object.")
    return body


async def _control(request: web.Request, fn: Any, *, body: bool = True) -> web.Response:
    try:
        data = await request.json() if body and request.can_read_body else {}
        if not isinstance(data, dict):
            raise TypeError("expected a JSON object")
        for key in [k for k in data if k.endswith("_b64")]:  # bytes travel as base64
            data[key[:-4]] = base64.b64decode(data.pop(key))
        result = fn(data)
        if asyncio.iscoroutine(result):
            result = await result
        return web.json_response(result, dumps=_dumps)
    except (ValueError, KeyError, TypeError) as e:
        return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=400)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=lambda o: base64.b64encode(o).decode() if isinstance(o, bytes) else str(o))


# --- as a process of its own ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fake_whatsapp", description=__doc__.splitlines()[0])
    p.add_argument("--port-file", type=Path, required=True, help="where to write the port once listening")
    p.add_argument("--token", action="append", help=f"an accepted access token (repeatable; default {DEFAULT_TOKEN})")
    p.add_argument("--number", action="append", help="a business number as PHONE_NUMBER_ID:DISPLAY (repeatable)")
    p.add_argument("--webhook", help="subscribe this URL: inbound messages and statuses are posted to it")
    p.add_argument("--app-secret", default=DEFAULT_APP_SECRET, help="the app secret webhooks are signed with")
    p.add_argument("--media-ttl", type=float, default=MEDIA_TTL, help="seconds a media URL stays valid")
    p.add_argument("--window", type=float, default=WINDOW, help="the customer-service window in seconds")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--lifetime", type=float, default=900.0, help="stop after this many seconds (default 900)")
    args = p.parse_args(argv)
    numbers = {n.partition(":")[0]: n.partition(":")[2] or n.partition(":")[0] for n in args.number or []} or None
    fake = FakeWhatsApp(tokens=args.token or [DEFAULT_TOKEN], numbers=numbers, host=args.host, port=args.port,
                        media_ttl=args.media_ttl, window=args.window)
    if args.webhook:
        fake.subscribe(args.webhook, args.app_secret)
    asyncio.run(serve_until_stopped(fake, args.port_file, args.lifetime, "fake_whatsapp"))
    return 0


class FakeWhatsAppProcess(FakeServerProcess):
    """`python -m tests.fake_whatsapp` as a child process, for synchronous end-to-end tests; every wait bounded.
    The helpers mirror FakeWhatsApp's and go through the control endpoints; content is bytes."""

    name = "fake_whatsapp"

    def __init__(self, workdir: Path, *, token: str = DEFAULT_TOKEN, numbers: dict[str, str] | None = None,
                 webhook: str | None = None, app_secret: str = DEFAULT_APP_SECRET, media_ttl: float = MEDIA_TTL,
                 window: float = WINDOW, lifetime: float = 600.0) -> None:
        super().__init__(workdir, lifetime=lifetime)
        self.token = token
        self.numbers = dict(numbers or {DEFAULT_PHONE_NUMBER_ID: DEFAULT_DISPLAY_NUMBER})
        self.webhook, self.app_secret, self.media_ttl, self.window_s = webhook, app_secret, media_ttl, window

    @property
    def api_base(self) -> str:
        return f"{self.url}/{API_VERSION}"

    @property
    def phone_number_id(self) -> str:
        return next(iter(self.numbers))

    def extra_args(self) -> list[str]:
        args = ["--token", self.token, "--media-ttl", str(self.media_ttl), "--window", str(self.window_s)]
        args += [a for pnid, display in self.numbers.items() for a in ("--number", f"{pnid}:{display}")]
        if self.webhook:
            args += ["--webhook", self.webhook, "--app-secret", self.app_secret]
        return args

    def _post(self, action: str, data: dict[str, Any], timeout: float = 5.0) -> Any:
        return self._call("POST", f"/_control/{action}", data, timeout=timeout)

    def message(self, from_: str, text: str | None = None, *, content: bytes | None = None,
                **kw: Any) -> dict[str, Any]:
        """{"payload", "wamid"}."""
        if content is not None:
            kw["content_b64"] = base64.b64encode(content).decode()
        return self._post("messages", {"from_": from_, "text": text, **kw})

    def statuses(self, wamid: str, statuses: list[str] | tuple[str, ...] | str = ("sent", "delivered", "read"),
                 **kw: Any) -> list[dict[str, Any]]:
        return self._post("statuses", {"wamid": wamid, "statuses": statuses, **kw})

    def deliver(self, url: str | None = None, payload: Any = None, app_secret: str | None = None,
                **kw: Any) -> list[dict[str, Any]]:
        data: dict[str, Any] = {"url": url, "app_secret": app_secret, **kw}
        if isinstance(payload, (bytes, str)):
            data["payload_b64"] = base64.b64encode(encode_body(payload)).decode()
        else:
            data["payload"] = payload
        return self._post("deliver", data, timeout=60.0)

    def verify(self, url: str | None = None, verify_token: str = DEFAULT_VERIFY_TOKEN,
               challenge: str | None = None, mode: str = "subscribe") -> dict[str, Any]:
        return self._post("verify", {"url": url, "verify_token": verify_token, "challenge": challenge,
                                     "mode": mode}, timeout=15.0)

    def subscribe(self, url: str | None, app_secret: str = DEFAULT_APP_SECRET, *,
                  auto_statuses: list[str] | tuple[str, ...] = ()) -> None:
        self._post("subscribe", {"url": url, "app_secret": app_secret, "auto_statuses": list(auto_statuses)})

    def add_media(self, content: bytes, **kw: Any) -> dict[str, Any]:
        return self._post("media", {"content_b64": base64.b64encode(content).decode(), **kw})

    def script_error(self, code: int, **kw: Any) -> dict[str, Any]:
        return self._post("errors", {"code": code, **kw})

    def clear_errors(self) -> None:
        self._call("DELETE", "/_control/errors")

    @property
    def scripted(self) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/errors")

    def window(self, wa_id: str, phone_number_id: str | None = None) -> dict[str, Any]:
        return self._post("window", {"wa_id": wa_id, "phone_number_id": phone_number_id})

    def open_window(self, wa_id: str, phone_number_id: str | None = None) -> dict[str, Any]:
        return self._post("open_window", {"wa_id": wa_id, "phone_number_id": phone_number_id})

    def age_window(self, wa_id: str, seconds: float | None = None,
                   phone_number_id: str | None = None) -> dict[str, Any]:
        return self._post("age_window", {"wa_id": wa_id, "seconds": seconds, "phone_number_id": phone_number_id})

    def close_window(self, wa_id: str, phone_number_id: str | None = None) -> dict[str, Any]:
        return self._post("close_window", {"wa_id": wa_id, "phone_number_id": phone_number_id})

    def set_rate_limit(self, pair_interval: float | None = None, per_second: int | None = None) -> None:
        self._post("rate_limit", {"pair_interval": pair_interval, "per_second": per_second})

    def configure(self, **kw: Any) -> None:
        self._post("configure", kw)

    def expire_media_urls(self, media_id: str | None = None) -> dict[str, Any]:
        return self._post("expire_media", {"media_id": media_id})

    def drain(self, timeout: float = 10.0) -> dict[str, Any]:
        return self._post("drain", {"timeout": timeout}, timeout=timeout + 5)

    def pending(self) -> int:
        return self._call("GET", "/_control/pending")["pending"]

    def records(self, kind: str, /, since: float | None = None, **filters: Any) -> list[dict[str, Any]]:
        return self._call("GET", f"/_control/records/{kind}", query={"since": since, **filters})

    def sent(self, to: str | None = None, since: float | None = None, **filters: Any) -> list[dict[str, Any]]:
        return self.records("sent", since, wa_id=None if to is None else wa_id_of(to), **filters)

    def deliveries(self, since: float | None = None, **filters: Any) -> list[dict[str, Any]]:
        return self.records("deliveries", since, **filters)

    def clear(self, kind: str) -> None:
        self._call("DELETE", f"/_control/records/{kind}")

    def reset(self) -> None:
        self._post("reset", {})


if __name__ == "__main__":
    sys.exit(main())
