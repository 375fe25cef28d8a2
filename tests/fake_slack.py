"""Fake Slack for tests: the Web API at `{url}/api/<method>`, Socket Mode over a WebSocket, file uploads and
downloads on 127.0.0.1, and a client that posts signed Events API requests to a gateway.

In a test's event loop::

    async with FakeSlack(ack_timeout=0.5) as sl:   # one app (workspace + bot + app token) unless apps=[...]
        api_base = sl.api_base                       # f"{url}/api", in place of https://slack.com/api
        env = sl.message("D0001", "U0001", "hi")     # a DM, as an events_api envelope over Socket Mode
        ...                                          # the gateway acks it, answers with chat.postMessage
        await sl.wait_for("posted", channel="D0001")  # [{"channel", "thread_ts", "text", "blocks", "ts", "time"}]

As a process of its own: ``python -m tests.fake_slack --port-file PATH [--app JSON ...] [--ack-timeout S]``;
`FakeSlackProcess` wraps it for synchronous tests and speaks the control endpoints below.

Slack behaviour (checked against Slack's documentation; the fake's own choices are marked "fake"):
  - Web API: any method by GET or POST; parameters from the query string, a JSON body or a form (blocks, files
    and loading_messages may be JSON strings in a form). The token is `Authorization: Bearer`, or a `token`
    form/query parameter (never in a JSON body). Answers are HTTP 200 {"ok": true, ...} or {"ok": false,
    "error"}: not_authed, invalid_auth, not_allowed_token_type (xapp- for a bot method or xoxb- for
    apps.connections.open, which takes its token from the header only), unknown_method; rate limits are
    HTTP 429 with `Retry-After: <s>` and {"ok": false, "error": "ratelimited"}.
  - auth.test; apps.connections.open -> {"url": "ws://127.0.0.1:<port>/socket?ticket=..&app_id=.."} (a ticket
    works once); chat.postMessage(channel, text, blocks, thread_ts, mrkdwn) -> {"channel", "ts", "message"}:
    channel_not_found (unknown channel: channels are known once added or named by an injected event; fake),
    not_in_channel, is_archived, no_text, msg_too_long (text over 40,000 chars), invalid_blocks (not a list of
    typed objects, over 50 blocks, a section text over 3,000 chars), invalid_blocks_format; chat.update(channel,
    ts, text, blocks): the channel and ts of a message the channel has (message_not_found) that this bot posted
    (cant_update_message), text as chat.postMessage's (msg_too_long, invalid_blocks), neither text nor blocks is
    no_text; chat.delete(channel, ts) (message_not_found, cant_delete_message; recorded as "deleted");
    reactions.add / reactions.remove (channel, name, timestamp: already_reacted, no_reaction, message_not_found,
    invalid_name); assistant.threads.setStatus(channel_id, thread_ts, status); files.getUploadURLExternal(filename,
    length) -> {"upload_url", "file_id"}, then a POST of the bytes (raw or multipart) to upload_url ("OK - <n>"),
    then files.completeUploadExternal(files=[{"id", "title"}], channel_id, thread_ts, initial_comment) ->
    {"files": [...]} (file_not_found if never uploaded; fake); users.info; conversations.info;
    conversations.replies(channel, ts).
  - Inbound files: `url_private_download` on the fake needs the bot token as Bearer; without it the answer is a
    302 to an HTML sign-in page (200 text/html), as Slack does.
  - Socket Mode: on connect `hello` {num_connections, debug_info {host, build_number,
    approximate_connection_time}, connection_info {app_id}}; envelopes {envelope_id, type (events_api |
    interactive | slash_commands), payload, accepts_response_payload, retry_attempt, retry_reason}; an ack is
    {"envelope_id", "payload"?}. An events_api envelope not acked within ack_timeout s is sent again under a new
    envelope_id with retry_attempt+1 and retry_reason "timeout" (after retry_delays[n] s more: Slack's spacing),
    up to max_retries times (then "expired");
    interactive and slash_commands envelopes are not retried. Envelopes go round-robin to the app's live
    connections (at most 10; an 11th gets disconnect "too_many_websockets"), wait while there is none, and never
    go to a connection that was sent a disconnect frame or silenced. WebSocket pings are answered (and counted).
  - Events API (HTTP): post_event signs `v0:{timestamp}:{raw body}` with HMAC-SHA256 -> X-Slack-Signature
    "v0=<hex>" and X-Slack-Request-Timestamp; retries carry X-Slack-Retry-Num / X-Slack-Retry-Reason.

Test-side controls (methods of FakeSlack; the same over HTTP in both modes). `app` = an app id, team id or token
(default: the first app); `conn` = a connection id (default: every live connection of the app):
  add_app(**app_defaults keys) / add_channel(id, type=, name=, member=, archived=, user=) / add_user(id, name=)
  add_file(content, name=, mimetype=, size=)   a file for an inbound share: {"id", "url_private_download", ...}
  message(channel, user, text, ts=, thread_ts=, channel_type=, files=, bot_id=, subtype=, extra=)
  app_mention(channel, user, text, ts=, thread_ts=, files=)     the text gets "<@bot> " unless it mentions it
  block_actions(channel, user, action_id, value=, message_ts=, thread_ts=, block_id=, text=)
  slash_command(channel, user, command, text=) / event(inner_event) / inject(payload, type=, accepts_response_payload=)
      each builds an envelope (event_callback payloads carry event_id, event_time, team_id, api_app_id,
      authorizations), queues it for Socket Mode unless deliver=False, and returns it
  send_raw(frame, conn=)             any text/JSON frame, not tracked
  disconnect(reason, conn=, close_after=)   "warning" | "refresh_requested" | "link_disabled" (closes at once
                                     unless close_after says otherwise) | "too_many_websockets"
  close(conn=, code=1000) / drop(conn=) (TCP abort, no close frame) / silence(conn=) (stops reading, answering
                                     pings and sending, without closing: a half-open socket)
  script_error(method, error="ratelimited", times=1, channel=None, retry_after=1, http_status=None)
                                     the next `times` matching calls fail ("*": any method)
  set_rate_limit(min_interval, retry_after=None, method="chat.postMessage", per_channel=True)   None: off
  configure(ack_timeout=, max_retries=, retry_delays=, strict_channels=, echo_bot_messages=, max_upload=)
  records(kind, since=, **field filters), oldest first; since= compares "time" (time.time() when recorded,
  the clock of post_event and of a gateway's own logs); kinds: requests posted updates reactions statuses uploads
  envelopes (each attempt as sent) acks expired frames (other client frames) connections responses (POSTs to a
  response_url). Shortcuts: posted(channel, thread_ts) updates() reactions() statuses() uploads() envelopes()
  acks() connections() requests(method); pending() unacked envelopes; upload_content(file_id); wait_for(kind,
  n=1, timeout=5, **filters) (awaited in-loop, blocking in FakeSlackProcess); reset() forgets records, scripted
  errors, rate rules and queued envelopes. The first app's bot_token, app_token, signing_secret, team_id,
  app_id, bot_user_id and bot_id are attributes of both FakeSlack and FakeSlackProcess.

Control endpoints (both modes), JSON in and out:
  GET  /_control/health | /_control/apps | /_control/errors | /_control/pending[?app=]
  GET  /_control/records/<kind>[?since=&<field>=<value>...]      DELETE forgets them
  GET  /_control/uploads/<file_id>    {"content_b64"}
  POST /_control/<action> {keyword arguments} for action in: apps channels users files events (with "kind":
       message | app_mention | block_actions | slash_command | event | inject; file content as "content_b64")
       raw errors rate_limit disconnect close drop silence configure reset;      DELETE /_control/errors

Tokens are never recorded. Everything is bounded: records, queues, channels, files, bodies, frames, waits.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import hmac
import json
import math
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.fake_server import FakeServerProcess, listen, serve_until_stopped

MAX_RECORDED = 5000
MAX_PENDING = 10000  # envelopes queued or unacked, per app
MAX_CONNECTIONS = 10  # Slack's limit per app
MAX_CHANNELS = 10000
MAX_MESSAGES_PER_CHANNEL = 1000
MAX_FILES = 1000
MAX_RULES = 1000
MAX_TEXT = 40000
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_BODY = 60 * 1024 * 1024
MAX_FRAME = 1024 * 1024
MAX_PARAM_RECORDED = 2000
SLACK_RETRY_DELAYS = (0.0, 60.0, 300.0)  # Slack retries a failed delivery 3 times: at once, after 1 and 5 min
RECORD_KINDS = (
    "requests", "posted", "updates", "deleted", "reactions", "statuses", "uploads", "envelopes", "acks", "expired",
    "frames", "connections", "responses",
)
DISCONNECT_REASONS = ("warning", "refresh_requested", "link_disabled", "too_many_websockets")
LOGIN_PAGE = "<!DOCTYPE html><html><head><title>Slack</title></head><body>Sign in to your workspace</body></html>"


def app_defaults(n: int = 1) -> dict[str, str]:
    """The credentials and ids of the fake's n-th app (1-based) unless given."""
    return {
        "bot_token": f"xoxb-{n}000-{n}111-FakeSlackBotToken", "app_token": f"xapp-1-A0FAKE{n:03d}-{n}222-FakeAppToken",
        "signing_secret": f"fake-signing-secret-{n:03d}", "team_id": f"T0FAKE{n:03d}", "team_name": f"Fake Team {n}",
        "app_id": f"A0FAKE{n:03d}", "bot_user_id": f"U0BOT{n:03d}", "bot_id": f"B0BOT{n:03d}", "bot_name": f"starling{n}",
    }


DEFAULT = app_defaults(1)
DEFAULT_BOT_TOKEN = DEFAULT["bot_token"]
DEFAULT_APP_TOKEN = DEFAULT["app_token"]
DEFAULT_SIGNING_SECRET = DEFAULT["signing_secret"]


class ApiError(Exception):
    """An error answer: {"ok": false, "error"} with an HTTP status (429 adds Retry-After)."""

    def __init__(self, error: str, status: int = 200, retry_after: int | None = None) -> None:
        super().__init__(error)
        self.error, self.status, self.retry_after = error, status, retry_after


# --- the Events API client (the fake posting to a gateway) ---------------------------------------------------


def sign(signing_secret: str, timestamp: int | str, body: bytes) -> str:
    """Slack's request signature v0: "v0=" + hex HMAC-SHA256 of b"v0:{timestamp}:{body}"."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return "v0=" + hmac.new(signing_secret.encode(), base, hashlib.sha256).hexdigest()


def url_verification(challenge: str | None = None) -> dict[str, Any]:
    """The body Slack posts to check a Request URL; the answer must echo "challenge"."""
    return {"token": "fakeVerificationToken", "challenge": challenge or secrets.token_urlsafe(24),
            "type": "url_verification"}


@dataclass
class EventPost:
    """What a post_event got back: HTTP status (0: no answer), body text, body as JSON (None if not), seconds."""

    status: int
    body: str
    json: Any
    elapsed: float


def event_request(
    event: Any, signing_secret: str, *, timestamp: int | float | None = None, wrong_signature: bool = False,
    retry_num: int | None = None, retry_reason: str = "http_timeout", form: bool = False, unsigned: bool = False,
) -> tuple[bytes, dict[str, str]]:
    """The raw body and headers of a signed Events API request. `event`: an event_callback payload, an envelope
    (its payload is sent), any other JSON value, or str/bytes sent as is; form=True urlencodes a dict (values
    that are not strings as JSON), as Slack posts slash commands and {"payload": ...} interactivity."""
    if isinstance(event, dict) and "envelope_id" in event and "payload" in event:
        event = event["payload"]
    if isinstance(event, (bytes, bytearray)):
        body = bytes(event)
    elif isinstance(event, str):
        body = event.encode()
    elif form:
        body = urllib.parse.urlencode({k: v if isinstance(v, str) else json.dumps(v) for k, v in event.items()}).encode()
    else:
        body = json.dumps(event).encode()
    headers = {"Content-Type": "application/x-www-form-urlencoded" if form else "application/json",
               "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)"}
    if not unsigned:
        ts = str(int(time.time() if timestamp is None else timestamp))
        headers["X-Slack-Request-Timestamp"] = ts
        headers["X-Slack-Signature"] = sign(signing_secret + ("-forged" if wrong_signature else ""), ts, body)
    if retry_num:
        headers["X-Slack-Retry-Num"] = str(int(retry_num))
        headers["X-Slack-Retry-Reason"] = retry_reason
    return body, headers


def _event_post(status: int, text: str, t0: float) -> EventPost:
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return EventPost(status, text, parsed, time.monotonic() - t0)


def post_event(url: str, event: Any, signing_secret: str, *, timeout: float = 10.0, **kw: Any) -> EventPost:
    """POST a signed Events API request to `url` (a plain, blocking function; event_request's keywords:
    timestamp=, wrong_signature=, retry_num=, retry_reason=, form=, unsigned=). Never raises for HTTP or
    connection errors: status 0 and the error in body when nothing answered. In an event loop whose server is
    the receiver: `await asyncio.to_thread(post_event, ...)`."""
    body, headers = event_request(event, signing_secret, **kw)
    t0 = time.monotonic()
    req = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return _event_post(resp.status, resp.read(MAX_FRAME).decode(errors="replace"), t0)
    except urllib.error.HTTPError as e:
        return _event_post(e.code, e.read(MAX_FRAME).decode(errors="replace"), t0)
    except (OSError, urllib.error.URLError) as e:
        return EventPost(0, f"{type(e).__name__}: {e}", None, time.monotonic() - t0)


# --- state ---------------------------------------------------------------------------------------------------


class _Channel:
    def __init__(self, cid: str, kind: str, name: str | None, user: str | None) -> None:
        self.id, self.type, self.user = cid, kind, user
        self.name = name or cid.lower()
        self.member, self.archived = True, False
        self.messages: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.reactions: dict[str, set[str]] = {}


class _App:
    """One app installed in one workspace: its tokens, channels, users, files, connections and envelopes."""

    def __init__(self, n: int, **given: Any) -> None:
        cfg = app_defaults(n)
        unknown = set(given) - set(cfg)
        if unknown:
            raise ValueError(f"unknown app keys {sorted(unknown)}; known: {sorted(cfg)}")
        cfg.update({k: str(v) for k, v in given.items() if v is not None})
        if not cfg["bot_token"].startswith("xoxb-") or not cfg["app_token"].startswith("xapp-"):
            raise ValueError("a bot token starts with xoxb-, an app-level token with xapp-")
        self.cfg = cfg
        self.id = cfg["app_id"]
        self.team_id, self.bot_user_id, self.bot_id = cfg["team_id"], cfg["bot_user_id"], cfg["bot_id"]
        self.bot_token, self.app_token = cfg["bot_token"], cfg["app_token"]
        self.channels: dict[str, _Channel] = {}
        self.users: dict[str, str] = {}  # id -> name
        self.files: OrderedDict[str, tuple[dict[str, Any], bytes]] = OrderedDict()
        self.conns: list[_Conn] = []
        self.queue: deque[_Delivery] = deque()
        self.deliveries: dict[str, _Delivery] = {}  # first envelope_id -> not yet acked nor expired
        self.rr = 0

    def public(self) -> dict[str, Any]:
        return {k: v for k, v in self.cfg.items() if not k.endswith(("_token", "_secret"))}


class _Conn:
    def __init__(self, cid: int, app: _App, ws: web.WebSocketResponse, transport: Any) -> None:
        self.id, self.app, self.ws, self.transport = cid, app, ws, transport
        self.out: asyncio.Queue[tuple[str | None, Any]] = asyncio.Queue()
        self.live, self.silent, self.retiring = True, False, False
        self.timers: list[asyncio.TimerHandle] = []
        self.record: dict[str, Any] = {"app": app.id, "conn": cid, "time": time.time(), "closed": None, "code": None,
                                       "silent": False, "pings": 0, "disconnects": []}


class _Delivery:
    """One envelope until it is acked or expires; each attempt goes out under a new envelope_id."""

    def __init__(self, app: _App, env: dict[str, Any], event_id: str | None) -> None:
        self.app, self.event_id = app, event_id
        self.first_id = self.envelope_id = env["envelope_id"]
        self.type, self.payload, self.accepts = env["type"], env["payload"], env["accepts_response_payload"]
        self.attempt, self.reason = 0, ""
        self.acked = False
        self.sent = False
        self.conn: int | None = None
        self.timer: asyncio.TimerHandle | None = None

    def frame(self) -> dict[str, Any]:
        env = {"envelope_id": self.envelope_id, "payload": self.payload, "type": self.type,
               "accepts_response_payload": self.accepts}
        if self.type == "events_api":
            env.update(retry_attempt=self.attempt, retry_reason=self.reason)
        return env

    def public(self) -> dict[str, Any]:
        return {"app": self.app.id, "delivery": self.first_id, "envelope_id": self.envelope_id,
                "event_id": self.event_id, "type": self.type, "attempt": self.attempt, "sent": self.sent,
                "conn": self.conn}


def _shortcut(kind: str, *names: str) -> Any:
    def get(self: Any, *args: Any, **filters: Any) -> list[dict[str, Any]]:
        return self.records(kind, **dict(zip(names, args)), **filters)

    get.__name__, get.__doc__ = kind, f"records({kind!r}, since=None, **filters); positional: {names}"
    return get


class _Shortcuts:
    """records(kind, ...) by name, for FakeSlack and FakeSlackProcess alike."""

    posted = _shortcut("posted", "channel", "thread_ts")  # {app, channel, thread_ts, text, blocks, mrkdwn, ts, time}
    updates = _shortcut("updates", "channel")  # chat.update: {app, channel, ts, text, blocks, time}
    deleted = _shortcut("deleted", "channel")  # chat.delete: {app, channel, ts, time}
    reactions = _shortcut("reactions", "channel")  # {app, channel, ts, name, action: add | remove, time}
    statuses = _shortcut("statuses", "channel")  # assistant.threads.setStatus: {channel, thread_ts, status, ...}
    uploads = _shortcut("uploads", "channel")  # {file_id, name, title, length, bytes, sha256, channel, thread_ts, ...}
    envelopes = _shortcut("envelopes")  # sent: {conn, envelope_id, delivery, event_id, type, attempt, retry_reason}
    acks = _shortcut("acks")  # {conn, envelope_id, delivery, event_id, attempt, duplicate, payload, time}
    connections = _shortcut("connections")  # {conn, time (opened), closed, code, silent, pings, disconnects}
    requests = _shortcut("requests", "method")  # Web API calls: {method, http, params, status, error, time}


# --- the server ----------------------------------------------------------------------------------------------


class FakeSlack(_Shortcuts):
    """The fake Slack in the current event loop; `async with` starts and stops it."""

    def __init__(
        self, apps: list[dict[str, Any]] | None = None, *, host: str = "127.0.0.1", port: int = 0,
        ack_timeout: float = 3.0, max_retries: int = 3, strict_channels: bool = True,
        echo_bot_messages: bool = False, max_upload: int = 50 * 1024 * 1024,
    ) -> None:
        self.host, self.port = host, port
        self.ack_timeout, self.max_retries = 3.0, 3
        self.retry_delays: list[float] = []
        self.strict_channels, self.echo_bot_messages, self.max_upload = True, False, 0
        self.configure(ack_timeout=ack_timeout, max_retries=max_retries, strict_channels=strict_channels,
                       echo_bot_messages=echo_bot_messages, max_upload=max_upload)
        self._apps: list[_App] = []
        self._rec: dict[str, deque[dict[str, Any]]] = {k: deque(maxlen=MAX_RECORDED) for k in RECORD_KINDS}
        self._rules: list[dict[str, Any]] = []
        self._rates: dict[str, tuple[float, int | None, bool]] = {}
        self._last_call: OrderedDict[tuple[Any, ...], float] = OrderedDict()
        self._tickets: OrderedDict[str, _App] = OrderedDict()
        self._uploads: OrderedDict[str, dict[str, Any]] = OrderedDict()  # file_id -> an upload not completed
        self._upload_keys: dict[str, str] = {}  # upload URL key -> file_id
        self._uploaded: OrderedDict[str, bytes] = OrderedDict()  # file_id -> completed upload's bytes
        self._by_envelope: OrderedDict[str, tuple[_Delivery, int]] = OrderedDict()
        self._id_base = secrets.token_hex(2).upper()  # ids stay unique across fakes sharing one database
        self._seq = self._conn_seq = self._last_us = 0
        self._runner: web.AppRunner | None = None
        self._stopping = False
        self._methods = {
            "auth.test": self._auth_test, "apps.connections.open": self._connections_open,
            "chat.postmessage": self._post_message, "chat.update": self._update, "chat.delete": self._delete,
            "reactions.add": lambda a, p: self._react(a, p, True),
            "reactions.remove": lambda a, p: self._react(a, p, False),
            "assistant.threads.setstatus": self._set_status,
            "files.getuploadurlexternal": self._upload_url, "files.completeuploadexternal": self._complete_upload,
            "users.info": self._user_info, "conversations.info": self._conversation_info,
            "conversations.replies": self._replies,
        }
        for cfg in apps or [{}]:
            self.add_app(**cfg)

    # --- lifecycle ---

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def api_base(self) -> str:
        """In place of https://slack.com/api."""
        return f"{self.url}/api"

    async def start(self) -> FakeSlack:
        self._stopping = False
        app = web.Application(client_max_size=MAX_BODY)
        app.add_routes([
            web.route("*", "/api/{method}", self._api),
            web.get("/socket", self._socket),
            web.post("/upload/v1/{key}", self._upload),
            web.get("/files-pri/{key}/{rest:.*}", self._download),
            web.get("/", self._login_page),
            web.post("/actions/{key}", self._response_url),
            web.get("/_control/records/{kind}", self._c_records),
            web.delete("/_control/records/{kind}", self._c_clear_records),
            web.get("/_control/uploads/{file_id}", self._c_upload_content),
            web.delete("/_control/errors", self._c_clear_errors),
            web.get("/_control/{what}", self._c_get),
            web.post("/_control/{action}", self._c_action),
        ])
        self._runner, self.port = await listen(app, self.host, self.port)
        return self

    async def stop(self) -> None:
        self._stopping = True
        for a in self._apps:
            for d in a.deliveries.values():
                if d.timer is not None:
                    d.timer.cancel()
                d.sent = False
            a.queue = deque(a.deliveries.values())  # started again, the fake sends what is still unacked
            for c in list(a.conns):
                self._cancel_timers(c)
                c.transport.abort()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> FakeSlack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def configure(self, *, ack_timeout: float | None = None, max_retries: int | None = None,
                  strict_channels: bool | None = None, echo_bot_messages: bool | None = None,
                  max_upload: int | None = None, retry_delays: list[float] | None = None) -> None:
        """ack_timeout: s before an unacked envelope counts as failed; max_retries: redeliveries before it expires;
        retry_delays: s after the n-th failure before redelivery n goes out (the last repeats; [] or unset: at
        once). Slack's own, for Events API posts and Socket Mode envelopes alike: 3 retries, at once, after a
        minute, after five: ack_timeout=3, max_retries=3, retry_delays=[0, 60, 300] (SLACK_RETRY_DELAYS; a test
        may scale the times, never the count);
        strict_channels=False: any channel id is known (and any user); echo_bot_messages: each chat.postMessage
        comes back as a message event with bot_id, as with a message.* subscription; max_upload: bytes."""
        if ack_timeout is not None:
            if not 0.01 <= float(ack_timeout) <= 600:
                raise ValueError("ack_timeout must be 0.01..600 s")
            self.ack_timeout = float(ack_timeout)
        if max_retries is not None:
            if not 0 <= int(max_retries) <= 100:
                raise ValueError("max_retries must be 0..100")
            self.max_retries = int(max_retries)
        if retry_delays is not None:
            delays = [float(x) for x in retry_delays]
            if len(delays) > 100 or not all(0 <= x <= 3600 for x in delays):
                raise ValueError("retry_delays must be at most 100 delays of 0..3600 s")
            self.retry_delays = delays
        if strict_channels is not None:
            self.strict_channels = bool(strict_channels)
        if echo_bot_messages is not None:
            self.echo_bot_messages = bool(echo_bot_messages)
        if max_upload is not None:
            if not 0 < int(max_upload) <= MAX_BODY:
                raise ValueError(f"max_upload must be 1..{MAX_BODY}")
            self.max_upload = int(max_upload)

    # --- apps and the workspace ---

    def add_app(self, **cfg: Any) -> str:
        """Serve one more app (keys of app_defaults; the rest derived from its position); returns its app_id."""
        a = _App(len(self._apps) + 1, **cfg)
        for b in self._apps:
            if {a.bot_token, a.app_token, a.id} & {b.bot_token, b.app_token, b.id}:
                raise ValueError("an app with that token or id is already served")
        self._apps.append(a)
        return a.id

    def _app(self, key: str | None = None) -> _App:
        if key is None:
            return self._apps[0]
        for a in self._apps:
            if key in (a.id, a.team_id, a.bot_token, a.app_token):
                return a
        raise ValueError(f"no such app {str(key)[:12]!r}")

    def __getattr__(self, name: str) -> Any:
        """bot_token, app_token, signing_secret, team_id, app_id, bot_user_id, bot_id, ...: the first app's."""
        apps = self.__dict__.get("_apps")
        if apps and name in apps[0].cfg:
            return apps[0].cfg[name]
        raise AttributeError(name)

    def add_channel(self, id: str, *, type: str | None = None, name: str | None = None, member: bool | None = None,
                    archived: bool | None = None, user: str | None = None, app: str | None = None) -> dict[str, Any]:
        """Add or change a channel; type "im" | "channel" | "group" | "mpim" (default by the id: D im, G group,
        else channel). member=False: posts are not_in_channel; archived=True: is_archived."""
        a = self._app(app)
        ch = self._touch_channel(a, id, type, user)
        if name is not None:
            ch.name = name
        if member is not None:
            ch.member = bool(member)
        if archived is not None:
            ch.archived = bool(archived)
        return {"id": ch.id, "type": ch.type, "name": ch.name, "member": ch.member, "archived": ch.archived}

    def _touch_channel(self, a: _App, cid: Any, kind: str | None = None, user: str | None = None) -> _Channel:
        if not isinstance(cid, str) or not cid:
            raise ValueError("a channel id is a non-empty string")
        ch = a.channels.get(cid)
        if ch is None:
            if len(a.channels) >= MAX_CHANNELS:
                raise ValueError(f"at most {MAX_CHANNELS} channels per app")
            kind = kind or {"D": "im", "G": "group"}.get(cid[0], "channel")
            if kind not in ("im", "channel", "group", "mpim"):
                raise ValueError("channel type must be im, channel, group or mpim")
            ch = a.channels[cid] = _Channel(cid, kind, None, user)
        elif kind is not None and kind != ch.type:
            raise ValueError(f"channel {cid} is a {ch.type}")
        if user and ch.user is None and ch.type == "im":
            ch.user = user
        return ch

    def add_user(self, id: str, *, name: str | None = None, app: str | None = None) -> None:
        self._app(app).users[str(id)] = name or str(id).lower()

    def add_file(self, content: bytes, *, name: str = "file.txt", mimetype: str = "text/plain",
                 size: int | None = None, user: str | None = None, app: str | None = None) -> dict[str, Any]:
        """A file a user shares: its object as in a message's "files"; size overrides the reported size."""
        a = self._app(app)
        if len(content) > MAX_BODY:
            raise ValueError(f"file content over {MAX_BODY} bytes")
        fid = self._new_id("F")
        base = f"{self.url}/files-pri/{a.team_id}-{fid}"
        info = {
            "id": fid, "created": int(time.time()), "timestamp": int(time.time()), "name": name, "title": name,
            "mimetype": mimetype, "filetype": Path(name).suffix.lstrip(".") or "binary", "user": user or "U0FAKEUSER",
            "size": int(size if size is not None else len(content)), "mode": "hosted", "is_external": False,
            "is_public": False, "url_private": f"{base}/{name}", "url_private_download": f"{base}/download/{name}",
            "permalink": f"https://fake.slack.com/files/{fid}",
        }
        a.files[fid] = (info, bytes(content))
        while len(a.files) > MAX_FILES:
            a.files.popitem(last=False)
        return dict(info)

    # --- events in ---

    def message(
        self, channel: str, user: str, text: str = "", *, ts: str | None = None, thread_ts: str | None = None,
        channel_type: str | None = None, files: list[Any] | None = None, bot_id: str | None = None,
        subtype: str | None = None, extra: dict[str, Any] | None = None, app: str | None = None,
        deliver: bool = True,
    ) -> dict[str, Any]:
        """A `message` event (message.im / message.channels): files are add_file objects, bytes or
        (name, bytes[, mimetype]); with files the subtype is "file_share" unless given."""
        a = self._app(app)
        ch = self._touch_channel(a, channel, channel_type, None if bot_id else user)
        ev = self._message_event(a, "message", ch.id, user, text, ts, thread_ts, files, extra)
        ev["channel_type"] = ch.type
        if bot_id:
            ev["bot_id"] = bot_id
        else:
            ev["client_msg_id"] = str(uuid.uuid4())
        if subtype or files:
            ev["subtype"] = subtype or "file_share"
        return self._event(a, ev, deliver)

    def app_mention(
        self, channel: str, user: str, text: str = "", *, ts: str | None = None, thread_ts: str | None = None,
        files: list[Any] | None = None, extra: dict[str, Any] | None = None, app: str | None = None,
        deliver: bool = True,
    ) -> dict[str, Any]:
        """An `app_mention` event; Slack also sends a `message` for the same ts when subscribed to both."""
        a = self._app(app)
        mention = f"<@{a.bot_user_id}>"
        self._touch_channel(a, channel)
        ev = self._message_event(a, "app_mention", channel, user,
                                 text if mention in text else f"{mention} {text}".rstrip(), ts, thread_ts, files, extra)
        return self._event(a, ev, deliver)

    def _message_event(self, a: _App, kind: str, channel: str, user: str, text: str, ts: str | None,
                       thread_ts: str | None, files: list[Any] | None, extra: dict[str, Any] | None) -> dict[str, Any]:
        a.users.setdefault(user, user.lower())
        ts = ts or self._new_ts()
        ev: dict[str, Any] = {"type": kind, "user": user, "text": text, "ts": ts, "channel": channel, "event_ts": ts,
                              "team": a.team_id}
        if thread_ts:
            ev["thread_ts"] = thread_ts
        if files:
            ev["files"] = [self._file_ref(a, f, user) for f in files]
            ev["upload"] = False
        ev.update(extra or {})
        return ev

    def _file_ref(self, a: _App, f: Any, user: str) -> dict[str, Any]:
        if isinstance(f, dict):
            return f
        if isinstance(f, (bytes, bytearray)):
            return self.add_file(bytes(f), name=f"file{self._seq + 1}.bin", mimetype="application/octet-stream",
                                 user=user, app=a.id)
        name, content, *rest = f
        return self.add_file(content, name=name, mimetype=rest[0] if rest else "application/octet-stream",
                             user=user, app=a.id)

    def event(self, event: dict[str, Any], *, app: str | None = None, deliver: bool = True) -> dict[str, Any]:
        """Any inner event (reaction_added, an unknown type, ...) in an event_callback envelope."""
        return self._event(self._app(app), dict(event), deliver)

    def _event(self, a: _App, ev: dict[str, Any], deliver: bool) -> dict[str, Any]:
        if isinstance(ev.get("channel"), str) and isinstance(ev.get("ts"), str) and ev["channel"]:
            ch = self._touch_channel(a, ev["channel"])
            if ev["ts"] not in ch.messages:  # a message and an app_mention may share a ts
                self._remember(ch, {k: v for k, v in ev.items() if k not in ("channel", "event_ts", "channel_type")})
        event_id = self._new_id("Ev")
        payload = {
            "token": "fakeVerificationToken", "team_id": a.team_id, "api_app_id": a.id, "event": ev,
            "type": "event_callback", "event_id": event_id, "event_time": int(time.time()),
            "authorizations": [{"enterprise_id": None, "team_id": a.team_id, "user_id": a.bot_user_id,
                                "is_bot": True, "is_enterprise_install": False}],
            "is_ext_shared_channel": False, "event_context": f"4-{ev.get('type')}-{a.team_id}-{ev.get('channel')}",
        }
        return self._push(a, "events_api", payload, False, deliver, event_id)

    def block_actions(
        self, channel: str, user: str, action_id: str, value: str | None = None, *, message_ts: str | None = None,
        thread_ts: str | None = None, block_id: str = "actions", text: str = "Button", app: str | None = None,
        deliver: bool = True,
    ) -> dict[str, Any]:
        """A Block Kit button click on a message (the bot's latest post in the channel unless message_ts)."""
        a = self._app(app)
        ch = self._touch_channel(a, channel)
        if message_ts is None:
            mine = [m for m in ch.messages.values() if m.get("bot_id") == a.bot_id]
            message_ts = mine[-1]["ts"] if mine else self._new_ts()
        msg = ch.messages.get(message_ts) or {"type": "message", "ts": message_ts, "text": ""}
        container = {"type": "message", "message_ts": message_ts, "channel_id": channel, "is_ephemeral": False}
        if thread_ts or msg.get("thread_ts"):
            container["thread_ts"] = thread_ts or msg["thread_ts"]
        action = {"action_id": action_id, "block_id": block_id, "type": "button", "action_ts": self._new_ts(),
                  "text": {"type": "plain_text", "text": text, "emoji": True}}
        if value is not None:
            action["value"] = value
        payload = {
            "type": "block_actions", "user": {"id": user, "username": user.lower(), "name": user.lower(),
                                              "team_id": a.team_id},
            "api_app_id": a.id, "token": "fakeVerificationToken", "container": container,
            "trigger_id": f"{self._seq}.{secrets.token_hex(8)}", "team": {"id": a.team_id, "domain": "fake"},
            "enterprise": None, "is_enterprise_install": False, "channel": {"id": channel, "name": ch.name},
            "message": msg, "state": {"values": {}}, "response_url": self._new_response_url(a), "actions": [action],
        }
        return self._push(a, "interactive", payload, True, deliver, None)

    def slash_command(self, channel: str, user: str, command: str, text: str = "", *, app: str | None = None,
                      deliver: bool = True) -> dict[str, Any]:
        a = self._app(app)
        ch = self._touch_channel(a, channel)
        payload = {
            "token": "fakeVerificationToken", "team_id": a.team_id, "team_domain": "fake", "channel_id": channel,
            "channel_name": ch.name, "user_id": user, "user_name": user.lower(), "command": command, "text": text,
            "api_app_id": a.id, "is_enterprise_install": "false", "response_url": self._new_response_url(a),
            "trigger_id": f"{self._seq}.{secrets.token_hex(8)}",
        }
        return self._push(a, "slash_commands", payload, True, deliver, None)

    def inject(self, payload: Any, *, type: str = "events_api", accepts_response_payload: bool | None = None,
               app: str | None = None, deliver: bool = True) -> dict[str, Any]:
        """An envelope around any payload, malformed ones too, delivered and tracked like the others."""
        accepts = (type != "events_api") if accepts_response_payload is None else bool(accepts_response_payload)
        eid = payload.get("event_id") if isinstance(payload, dict) else None
        return self._push(self._app(app), str(type), payload, accepts, deliver, eid if isinstance(eid, str) else None)

    def _push(self, a: _App, kind: str, payload: Any, accepts: bool, deliver: bool,
              event_id: str | None) -> dict[str, Any]:
        env = {"envelope_id": str(uuid.uuid4()), "payload": payload, "type": kind, "accepts_response_payload": accepts}
        if kind == "events_api":
            env.update(retry_attempt=0, retry_reason="")
        if deliver:
            if len(a.deliveries) >= MAX_PENDING:
                raise ValueError(f"at most {MAX_PENDING} unacked envelopes per app")
            d = _Delivery(a, env, event_id)
            a.deliveries[d.first_id] = d
            a.queue.append(d)
            self._dispatch(a)
        return env

    def send_raw(self, frame: Any, *, conn: int | None = None, app: str | None = None) -> list[int]:
        """Send a frame as is (a str, or JSON of anything else) to connections; not tracked."""
        text = frame if isinstance(frame, str) else json.dumps(frame)
        targets = self._targets(conn, app)
        for c in targets:
            c.out.put_nowait((text, None))
        return [c.id for c in targets]

    # --- Socket Mode controls ---

    def _targets(self, conn: int | None, app: str | None) -> list[_Conn]:
        if conn is None:
            return [c for c in self._app(app).conns if c.live]
        for a in self._apps:
            for c in a.conns:
                if c.id == int(conn) and c.live:
                    return [c]
        raise ValueError(f"no live connection {conn}")

    def disconnect(self, reason: str = "refresh_requested", *, conn: int | None = None,
                   close_after: float | None = None, app: str | None = None) -> list[int]:
        """Send a disconnect frame; that connection gets no more envelopes. close_after: close it that many s
        later (None: leave it open, except link_disabled and too_many_websockets, which close at once)."""
        if reason not in DISCONNECT_REASONS:
            raise ValueError(f"reason must be one of {DISCONNECT_REASONS}")
        if close_after is None and reason in ("link_disabled", "too_many_websockets"):
            close_after = 0.0
        targets = self._targets(conn, app)
        for c in targets:
            c.retiring = True
            c.record["disconnects"].append(reason)
            c.out.put_nowait((json.dumps({"type": "disconnect", "reason": reason,
                                          "debug_info": {"host": f"applink-fake-{c.id}"}}), None))
            if close_after is not None:
                self._close_later(c, float(close_after), 1000)
        return [c.id for c in targets]

    def close(self, *, conn: int | None = None, code: int = 1000, app: str | None = None) -> list[int]:
        """Close cleanly (a close frame after what is already queued)."""
        targets = self._targets(conn, app)
        for c in targets:
            self._close_later(c, 0.0, int(code))
        return [c.id for c in targets]

    def drop(self, *, conn: int | None = None, app: str | None = None) -> list[int]:
        """Abort the TCP connection: no close frame."""
        targets = self._targets(conn, app)
        for c in targets:
            c.transport.abort()
        return [c.id for c in targets]

    def silence(self, *, conn: int | None = None, app: str | None = None) -> list[int]:
        """A half-open socket: stop reading, answering pings and sending, without closing. Only the client's own
        pings can tell; its envelopes go to other connections (or wait for one)."""
        targets = self._targets(conn, app)
        for c in targets:
            c.silent = c.record["silent"] = True
        return [c.id for c in targets]

    def _close_later(self, c: _Conn, after: float, code: int) -> None:
        if after <= 0:
            c.out.put_nowait((None, code))
        else:
            c.timers.append(asyncio.get_running_loop().call_later(after, c.out.put_nowait, (None, code)))

    @staticmethod
    def _cancel_timers(c: _Conn) -> None:
        for t in c.timers:
            t.cancel()
        c.timers.clear()

    # --- scripting ---

    def script_error(self, method: str, error: str = "ratelimited", *, times: int = 1, channel: str | None = None,
                     retry_after: int = 1, http_status: int | None = None, app: str | None = None) -> dict[str, Any]:
        """The next `times` calls of `method` ("*": any; for `channel` only) fail with `error`; "ratelimited" is
        HTTP 429 with Retry-After: retry_after (whole seconds); http_status overrides the status."""
        if not 1 <= int(times) <= 10000:
            raise ValueError("times must be 1..10000")
        if not 0 <= int(retry_after) <= 3600:
            raise ValueError("retry_after must be 0..3600 s")
        if len(self._rules) >= MAX_RULES:
            raise ValueError(f"at most {MAX_RULES} scripted errors")
        rule = {"app": None if app is None else self._app(app).id, "method": method.lower(), "error": str(error),
                "times": int(times), "channel": channel, "retry_after": int(retry_after),
                "http_status": None if http_status is None else int(http_status)}
        self._rules.append(rule)
        return dict(rule)

    @property
    def scripted(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rules]

    def clear_errors(self) -> None:
        self._rules.clear()

    def set_rate_limit(self, min_interval: float | None, retry_after: int | None = None, *,
                       method: str = "chat.postMessage", per_channel: bool = True) -> None:
        """A 2nd call of `method` ("*": any) for one channel (or at all, per_channel=False) within min_interval s
        is 429 with Retry-After (default: the rest of the interval, rounded up, at least 1). None: off."""
        if min_interval is None:
            self._rates.pop(method.lower(), None)
            return
        if not 0 < float(min_interval) <= 3600:
            raise ValueError("min_interval must be 0..3600 s")
        self._rates[method.lower()] = (float(min_interval), None if retry_after is None else int(retry_after),
                                       bool(per_channel))

    # --- reading what happened ---

    def records(self, kind: str, *, since: float | None = None, **filters: Any) -> list[dict[str, Any]]:
        """Records of `kind` (RECORD_KINDS), oldest first; since: "time" >= since; filters: field == value
        (compared as strings; None: no filter; app= takes any app key)."""
        if kind not in self._rec:
            raise ValueError(f"kind must be one of {RECORD_KINDS}")
        if filters.get("app") is not None:
            filters["app"] = self._app(filters["app"]).id
        want = {k: str(v) for k, v in filters.items() if v is not None}
        return [dict(r) for r in self._rec[kind]
                if (since is None or r["time"] >= float(since)) and all(str(r.get(k)) == v for k, v in want.items())]

    def pending(self, app: str | None = None) -> list[dict[str, Any]]:
        """Envelopes not acked yet (queued or in flight)."""
        return [d.public() for d in self._app(app).deliveries.values()]

    def upload_content(self, file_id: str) -> bytes:
        return self._uploaded[file_id]

    async def wait_for(self, kind: str, n: int = 1, timeout: float = 5.0, **filters: Any) -> list[dict[str, Any]]:
        """The matching records once there are at least n; TimeoutError after timeout s."""
        deadline = time.monotonic() + min(float(timeout), 600.0)
        while True:
            got = self.records(kind, **filters)
            if len(got) >= n:
                return got
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{len(got)} of {n} {kind} records after {timeout} s: {got[-3:]}")
            await asyncio.sleep(0.01)

    def reset(self) -> None:
        for r in self._rec.values():
            r.clear()
        self._rules.clear()
        self._rates.clear()
        self._last_call.clear()
        for a in self._apps:
            for d in a.deliveries.values():
                d.acked = True
                if d.timer is not None:
                    d.timer.cancel()
            a.deliveries.clear()
            a.queue.clear()

    def _record(self, kind: str, rec: dict[str, Any]) -> dict[str, Any]:
        rec.setdefault("time", time.time())
        self._rec[kind].append(rec)
        return rec

    def _new_ts(self) -> str:
        us = max(int(time.time() * 1_000_000), self._last_us + 1)
        self._last_us = us
        return f"{us // 1_000_000}.{us % 1_000_000:06d}"

    def _new_id(self, prefix: str) -> str:
        self._seq += 1
        return f"{prefix}{self._id_base}{self._seq:06d}"

    def _new_response_url(self, a: _App) -> str:
        return f"{self.url}/actions/{a.id}-{self._new_id('R')}"

    @staticmethod
    def _remember(ch: _Channel, msg: dict[str, Any]) -> None:
        ch.messages[msg["ts"]] = msg
        while len(ch.messages) > MAX_MESSAGES_PER_CHANNEL:
            ts, _ = ch.messages.popitem(last=False)
            ch.reactions.pop(ts, None)

    # --- the Web API ---

    async def _api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        rec = self._record("requests", {"app": None, "method": method, "http": request.method, "params": {}})
        try:
            params, bearer, form_token = await _read_params(request)
            rec["params"] = {k: (v[:MAX_PARAM_RECORDED] if isinstance(v, str) else v) for k, v in params.items()}
            m = method.lower()
            token = bearer or (None if m == "apps.connections.open" else form_token)
            if not token:
                raise ApiError("not_authed")
            a, kind = next(((x, k) for x in self._apps for k, t in (("bot", x.bot_token), ("app", x.app_token))
                            if t == token), (None, None))
            if a is None:
                raise ApiError("invalid_auth")
            rec["app"] = a.id
            fn = self._methods.get(m)
            if fn is None:
                raise ApiError("unknown_method")
            if kind != ("app" if m == "apps.connections.open" else "bot"):
                raise ApiError("not_allowed_token_type")
            self._scripted(a, m, params)
            self._rate_check(a, m, params)
            result = fn(a, params)
        except ApiError as e:
            rec.update(status=e.status, error=e.error)
            headers = {"Retry-After": str(e.retry_after)} if e.retry_after is not None else None
            return web.json_response({"ok": False, "error": e.error}, status=e.status, headers=headers)
        rec["status"] = 200
        return web.json_response({"ok": True, **result})

    def _scripted(self, a: _App, method: str, p: dict[str, Any]) -> None:
        channel = _channel_param(p)
        for i, r in enumerate(self._rules):
            if r["app"] not in (None, a.id) or r["method"] not in ("*", method):
                continue
            if r["channel"] is not None and r["channel"] != channel:
                continue
            r["times"] -= 1
            if r["times"] <= 0:
                del self._rules[i]
            if r["error"] == "ratelimited":
                raise ApiError("ratelimited", r["http_status"] or 429, r["retry_after"])
            raise ApiError(r["error"], r["http_status"] or 200)

    def _rate_check(self, a: _App, method: str, p: dict[str, Any]) -> None:
        rule = self._rates.get(method) or self._rates.get("*")
        if rule is None:
            return
        interval, fixed, per_channel = rule
        key = (a.id, method, _channel_param(p) if per_channel else None)
        now = time.monotonic()
        last = self._last_call.get(key)
        if last is not None and now - last < interval:
            raise ApiError("ratelimited", 429, fixed if fixed is not None else max(1, math.ceil(interval - (now - last))))
        self._last_call[key] = now
        self._last_call.move_to_end(key)
        while len(self._last_call) > MAX_RECORDED:
            self._last_call.popitem(last=False)

    def _channel(self, a: _App, cid: Any, *, post: bool = False) -> _Channel:
        ch = a.channels.get(cid) if isinstance(cid, str) and cid else None
        if ch is None:
            if self.strict_channels or not isinstance(cid, str) or not cid:
                raise ApiError("channel_not_found")
            ch = self._touch_channel(a, cid)
        if post and ch.archived:
            raise ApiError("is_archived")
        if post and not ch.member:
            raise ApiError("not_in_channel")
        return ch

    def _auth_test(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        return {"url": f"https://{a.team_id.lower()}.slack.com/", "team": a.cfg["team_name"],
                "user": a.cfg["bot_name"], "team_id": a.team_id, "user_id": a.bot_user_id, "bot_id": a.bot_id,
                "is_enterprise_install": False}

    def _connections_open(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        ticket = secrets.token_urlsafe(16)
        self._tickets[ticket] = a
        while len(self._tickets) > MAX_RECORDED:
            self._tickets.popitem(last=False)
        return {"url": f"ws://{self.host}:{self.port}/socket?ticket={ticket}&app_id={a.id}"}

    def _text(self, p: dict[str, Any], required: bool) -> tuple[str | None, Any]:
        text, blocks = p.get("text"), p.get("blocks")
        if blocks is not None:
            _check_blocks(blocks)
        if required and not str(text or "").strip() and not blocks:
            raise ApiError("no_text")
        if text is not None and len(str(text)) > MAX_TEXT:
            raise ApiError("msg_too_long")
        return (None if text is None else str(text)), blocks

    def _post_message(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        ch = self._channel(a, p.get("channel"), post=True)
        text, blocks = self._text(p, True)
        text = text or ""
        thread_ts = _opt_str(p.get("thread_ts"))
        ts = self._new_ts()
        msg: dict[str, Any] = {"type": "message", "user": a.bot_user_id, "bot_id": a.bot_id, "text": text, "ts": ts,
                               "team": a.team_id}
        if blocks:
            msg["blocks"] = blocks
        if thread_ts:
            msg["thread_ts"] = thread_ts
        self._remember(ch, dict(msg))
        self._record("posted", {"app": a.id, "channel": ch.id, "thread_ts": thread_ts, "text": text, "blocks": blocks,
                                "mrkdwn": str(p.get("mrkdwn", True)).lower() not in ("false", "0"), "ts": ts})
        if self.echo_bot_messages:
            self.message(ch.id, a.bot_user_id, text, ts=ts, thread_ts=thread_ts, bot_id=a.bot_id, app=a.id)
        return {"channel": ch.id, "ts": ts, "message": msg}

    def _own_message(self, a: _App, p: dict[str, Any], refusal: str) -> tuple[_Channel, str, dict[str, Any]]:
        """The channel, ts and message `p` names, which must be this app's (else `refusal`, as Slack says)."""
        ch = self._channel(a, p.get("channel"))
        ts = _opt_str(p.get("ts"))
        old = ch.messages.get(ts) if ts else None
        if old is None:
            raise ApiError("message_not_found")
        if old.get("bot_id") != a.bot_id:
            raise ApiError(refusal)
        return ch, ts, old

    def _update(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        ch, ts, old = self._own_message(a, p, "cant_update_message")
        text, blocks = self._text(p, False)
        if text is None and blocks is None:
            raise ApiError("no_text")
        new = {**old, "text": old.get("text", "") if text is None else text,
               "edited": {"user": a.bot_user_id, "ts": self._new_ts()}}
        if blocks is not None:
            new["blocks"] = blocks
        ch.messages[ts] = new
        self._record("updates", {"app": a.id, "channel": ch.id, "ts": ts, "text": new["text"], "blocks": blocks})
        return {"channel": ch.id, "ts": ts, "text": new["text"], "message": new}

    def _delete(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        ch, ts, _ = self._own_message(a, p, "cant_delete_message")
        del ch.messages[ts]
        self._record("deleted", {"app": a.id, "channel": ch.id, "ts": ts})
        return {"channel": ch.id, "ts": ts}

    def _react(self, a: _App, p: dict[str, Any], add: bool) -> dict[str, Any]:
        ch = self._channel(a, p.get("channel"))
        name, ts = str(p.get("name") or "").strip(":"), _opt_str(p.get("timestamp"))
        if not name:
            raise ApiError("invalid_name")
        if not ts or (ts not in ch.messages and self.strict_channels):
            raise ApiError("message_not_found")
        mine = ch.reactions.setdefault(ts, set())
        if add and name in mine:
            raise ApiError("already_reacted")
        if not add and name not in mine:
            raise ApiError("no_reaction")
        (mine.add if add else mine.discard)(name)
        self._record("reactions", {"app": a.id, "channel": ch.id, "ts": ts, "name": name,
                                   "action": "add" if add else "remove"})
        return {}

    def _set_status(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        ch = self._channel(a, p.get("channel_id"))
        thread_ts = _opt_str(p.get("thread_ts"))
        if not thread_ts:
            raise ApiError("invalid_thread_ts")
        if p.get("status") is None:
            raise ApiError("invalid_arguments")
        self._record("statuses", {"app": a.id, "channel": ch.id, "thread_ts": thread_ts, "status": str(p["status"]),
                                  "loading_messages": p.get("loading_messages")})
        return {}

    def _upload_url(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        filename = _opt_str(p.get("filename"))
        try:
            length = int(p.get("length"))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            length = 0
        if not filename or length <= 0:
            raise ApiError("invalid_arguments")
        if length > self.max_upload:
            raise ApiError("file_upload_size_restricted")
        fid, key = self._new_id("F"), secrets.token_urlsafe(16)
        self._uploads[fid] = {"app": a.id, "key": key, "filename": filename, "length": length, "content": None,
                              "alt_txt": p.get("alt_txt")}
        self._upload_keys[key] = fid
        while len(self._uploads) > MAX_FILES:
            self._upload_keys.pop(self._uploads.popitem(last=False)[1]["key"], None)
        return {"upload_url": f"{self.url}/upload/v1/{key}", "file_id": fid}

    async def _upload(self, request: web.Request) -> web.Response:
        fid = self._upload_keys.get(request.match_info["key"])
        up = self._uploads.get(fid) if fid else None
        rec = self._record("requests", {"app": up["app"] if up else None, "method": "upload", "http": "POST",
                                        "params": {"file_id": fid}})
        if up is None:
            rec["status"] = 404
            return web.Response(status=404, text="Not Found")
        data = bytearray()
        if request.content_type == "multipart/form-data":
            async for part in await request.multipart():
                if part.filename is None and part.name not in ("file", "filename"):
                    continue
                while chunk := await part.read_chunk():
                    data += chunk
                    if len(data) > self.max_upload:
                        break
                break
        else:
            data += await request.read()
        if len(data) > self.max_upload:
            rec["status"] = 413
            return web.Response(status=413, text="Request Entity Too Large")
        up["content"] = bytes(data)
        rec.update(status=200, bytes=len(data))
        return web.Response(text=f"OK - {len(data)}")

    def _complete_upload(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        files = p.get("files")
        if not isinstance(files, list) or not files or not all(isinstance(f, dict) for f in files) or (
                len({str(f.get("id")) for f in files}) != len(files)):
            raise ApiError("invalid_arguments")
        channel = p.get("channel_id") or (str(p["channels"]).split(",")[0] if p.get("channels") else None)
        ch = self._channel(a, channel, post=True) if channel else None
        thread_ts, comment = _opt_str(p.get("thread_ts")), p.get("initial_comment")
        ups = [self._uploads.get(f.get("id")) for f in files]
        if any(u is None or u["app"] != a.id or u["content"] is None for u in ups):
            raise ApiError("file_not_found")
        out = []
        for f, up in zip(files, ups):
            fid, content = f["id"], up["content"]
            del self._uploads[fid]
            self._upload_keys.pop(up["key"], None)
            self._uploaded[fid] = content
            while len(self._uploaded) > MAX_FILES:
                self._uploaded.popitem(last=False)
            title = str(f.get("title") or up["filename"])
            self._record("uploads", {
                "app": a.id, "file_id": fid, "name": up["filename"], "title": title, "length": up["length"],
                "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest(),
                "channel": ch.id if ch else None, "thread_ts": thread_ts, "initial_comment": comment,
            })
            out.append({"id": fid, "name": up["filename"], "title": title, "size": len(content)})
        if ch is not None:
            msg = {"type": "message", "user": a.bot_user_id, "bot_id": a.bot_id, "text": str(comment or ""),
                   "ts": self._new_ts(), "files": [{"id": o["id"]} for o in out]}
            if thread_ts:
                msg["thread_ts"] = thread_ts
            self._remember(ch, msg)
        return {"files": out}

    def _user_info(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        uid = p.get("user")
        if not isinstance(uid, str) or not uid or (
                self.strict_channels and uid not in a.users and uid != a.bot_user_id):
            raise ApiError("user_not_found")
        bot = uid == a.bot_user_id
        name = a.cfg["bot_name"] if bot else a.users.get(uid, uid.lower())
        return {"user": {"id": uid, "team_id": a.team_id, "name": name, "real_name": name, "is_bot": bot,
                         "deleted": False, "tz": "UTC", "profile": {"display_name": name, "real_name": name}}}

    def _conversation_info(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        ch = self._channel(a, p.get("channel"))
        info = {"id": ch.id, "is_channel": ch.type == "channel", "is_group": ch.type == "group",
                "is_im": ch.type == "im", "is_mpim": ch.type == "mpim", "is_private": ch.type != "channel",
                "is_archived": ch.archived, "is_member": ch.member}
        info.update({"user": ch.user} if ch.type == "im" else {"name": ch.name})
        return {"channel": info}

    def _replies(self, a: _App, p: dict[str, Any]) -> dict[str, Any]:
        ch = self._channel(a, p.get("channel"))
        ts = _opt_str(p.get("ts"))
        if not ts or ts not in ch.messages:
            raise ApiError("thread_not_found")
        root = ch.messages[ts].get("thread_ts") or ts
        msgs = sorted((m for m in ch.messages.values() if root in (m["ts"], m.get("thread_ts"))),
                      key=lambda m: float(m["ts"]))
        try:
            limit = max(1, min(int(p.get("limit") or 1000), 1000))
        except ValueError:
            raise ApiError("invalid_limit") from None
        return {"messages": msgs[:limit], "has_more": len(msgs) > limit, "response_metadata": {"next_cursor": ""}}

    async def _download(self, request: web.Request) -> web.Response:
        team, _, fid = request.match_info["key"].partition("-")
        a = next((x for x in self._apps if x.team_id == team and fid in x.files), None)
        auth = request.headers.get("Authorization", "")
        allowed = a is not None and any(auth == f"Bearer {x.bot_token}" for x in self._apps if x.team_id == team)
        self._record("requests", {"app": a.id if a else None, "method": "files.download", "http": "GET",
                                  "params": {"file_id": fid}, "status": 404 if a is None else 200 if allowed else 302})
        if a is None:
            return web.Response(status=404, text="Not Found")
        if not allowed:
            raise web.HTTPFound(f"/?redir={urllib.parse.quote(request.path)}")
        info, content = a.files[fid]
        return web.Response(body=content, content_type=info["mimetype"])

    async def _login_page(self, request: web.Request) -> web.Response:
        return web.Response(text=LOGIN_PAGE, content_type="text/html")

    async def _response_url(self, request: web.Request) -> web.Response:
        body = (await request.read()).decode(errors="replace")
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = body[:MAX_PARAM_RECORDED]
        self._record("responses", {"app": request.match_info["key"].split("-")[0], "url": str(request.url),
                                   "body": parsed})
        return web.Response(text="ok")

    # --- Socket Mode ---

    async def _socket(self, request: web.Request) -> web.StreamResponse:
        a = self._tickets.pop(request.query.get("ticket", ""), None)
        if a is None or self._stopping:
            return web.json_response({"ok": False, "error": "invalid_ticket"}, status=401)
        ws = web.WebSocketResponse(autoping=False, autoclose=False, max_msg_size=MAX_FRAME)
        await ws.prepare(request)
        self._conn_seq += 1
        c = _Conn(self._conn_seq, a, ws, request.transport)
        self._record("connections", c.record)
        live = [x for x in a.conns if x.live]
        a.conns.append(c)
        if len(live) >= MAX_CONNECTIONS:
            self.disconnect("too_many_websockets", conn=c.id)
        else:
            c.record["num_connections"] = len(live) + 1
            c.out.put_nowait((json.dumps({
                "type": "hello", "num_connections": len(live) + 1,
                "debug_info": {"host": f"applink-fake-{c.id}", "build_number": 1, "approximate_connection_time": 3600},
                "connection_info": {"app_id": a.id},
            }), None))
            self._dispatch(a)
        writer = asyncio.get_running_loop().create_task(self._writer(c))
        try:
            while not c.silent:
                msg = await ws.receive()
                if msg.type == aiohttp.WSMsgType.PING:
                    c.record["pings"] += 1
                if c.silent:
                    break
                if msg.type == aiohttp.WSMsgType.PING:
                    await ws.pong(msg.data)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    self._on_frame(c, msg.data)
                elif msg.type == aiohttp.WSMsgType.CLOSE:
                    await ws.close()
                    break
                elif msg.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
            while c.silent and not self._stopping and not c.transport.is_closing():
                await asyncio.sleep(0.05)  # half-open: hold the socket, read nothing
        except (ConnectionError, RuntimeError):
            pass
        finally:
            writer.cancel()
            self._closed(c)
        return ws

    async def _writer(self, c: _Conn) -> None:
        in_hand: _Delivery | None = None
        try:
            while True:
                text, item = await c.out.get()
                if text is None and c.silent:  # closing a half-open socket: drop it
                    c.transport.abort()
                    return
                if text is None:
                    await c.ws.close(code=item)
                    return
                if isinstance(item, _Delivery) and (item.acked or c.silent or c.retiring):
                    if not item.acked:
                        self._requeue(c.app, [item])
                    continue
                if c.silent:
                    continue
                in_hand = item if isinstance(item, _Delivery) else None
                await c.ws.send_str(text)
                if in_hand is not None:
                    self._sent(c, in_hand)
                    in_hand = None
        except (ConnectionError, RuntimeError):
            c.transport.abort()
        finally:
            if in_hand is not None and not in_hand.acked:  # it may have left: at least once, never lost
                self._requeue(c.app, [in_hand])

    def _closed(self, c: _Conn) -> None:
        c.live = False
        self._cancel_timers(c)
        c.record.update(closed=time.time(), code=c.ws.close_code)
        if c in c.app.conns:
            c.app.conns.remove(c)
        unsent = []
        while not c.out.empty():
            _, item = c.out.get_nowait()
            if isinstance(item, _Delivery) and not item.acked:
                unsent.append(item)
        self._requeue(c.app, unsent)

    def _requeue(self, a: _App, items: list[_Delivery]) -> None:
        """Envelopes that never left go back to the front of the queue, in order (stop() requeues them all)."""
        if self._stopping:
            return
        for d in reversed(items):
            a.queue.appendleft(d)
        if items:
            self._dispatch(a)

    def _dispatch(self, a: _App) -> None:
        live = [c for c in a.conns if c.live and not c.silent and not c.retiring]
        while a.queue and live:
            d = a.queue.popleft()
            if d.acked or d.first_id not in a.deliveries:
                continue
            c = live[a.rr % len(live)]
            a.rr += 1
            d.conn = c.id
            self._by_envelope[d.envelope_id] = (d, d.attempt)
            while len(self._by_envelope) > 2 * MAX_RECORDED:
                self._by_envelope.popitem(last=False)
            c.out.put_nowait((json.dumps(d.frame()), d))

    def _sent(self, c: _Conn, d: _Delivery) -> None:
        d.sent = True
        self._record("envelopes", {"app": c.app.id, "conn": c.id, "envelope_id": d.envelope_id,
                                   "delivery": d.first_id, "event_id": d.event_id, "type": d.type,
                                   "attempt": d.attempt, "retry_reason": d.reason})
        if d.timer is not None:
            d.timer.cancel()
        d.timer = asyncio.get_running_loop().call_later(self.ack_timeout, self._ack_timeout, d, d.attempt)

    def _ack_timeout(self, d: _Delivery, attempt: int) -> None:
        if d.acked or d.attempt != attempt or self._stopping or d.first_id not in d.app.deliveries:
            return
        if d.type != "events_api" or d.attempt >= self.max_retries:
            del d.app.deliveries[d.first_id]
            self._record("expired", d.public())
            return
        d.attempt += 1
        d.reason, d.envelope_id, d.sent = "timeout", str(uuid.uuid4()), False
        delay = self.retry_delays[min(d.attempt, len(self.retry_delays)) - 1] if self.retry_delays else 0.0
        if delay > 0:
            d.timer = asyncio.get_running_loop().call_later(delay, self._redeliver, d)
        else:
            self._redeliver(d)

    def _redeliver(self, d: _Delivery) -> None:
        if d.acked or self._stopping or d.first_id not in d.app.deliveries:
            return
        d.app.queue.append(d)
        self._dispatch(d.app)

    def _on_frame(self, c: _Conn, data: str) -> None:
        try:
            frame = json.loads(data)
        except ValueError:
            frame = None
        if not isinstance(frame, dict) or not isinstance(frame.get("envelope_id"), str):
            self._record("frames", {"app": c.app.id, "conn": c.id,
                                    "frame": frame if frame is not None else data[:MAX_PARAM_RECORDED]})
            return
        eid = frame["envelope_id"]
        d, attempt = self._by_envelope.get(eid, (None, None))
        self._record("acks", {"app": c.app.id, "conn": c.id, "envelope_id": eid,
                              "delivery": d.first_id if d else None, "event_id": d.event_id if d else None,
                              "attempt": attempt, "duplicate": d is None or d.acked, "payload": frame.get("payload")})
        if d is not None and not d.acked:
            d.acked = True
            if d.timer is not None:
                d.timer.cancel()
            d.app.deliveries.pop(d.first_id, None)

    # --- control ---

    def _c_event(self, kind: str = "message", **d: Any) -> Any:
        if isinstance(d.get("files"), list):
            d["files"] = [f if "id" in f else (f.get("name", "file.bin"), _content(f),
                                               f.get("mimetype", "application/octet-stream")) for f in d["files"]]
        helpers = {"message": self.message, "app_mention": self.app_mention, "block_actions": self.block_actions,
                   "slash_command": self.slash_command, "event": self.event, "inject": self.inject}
        if kind not in helpers:
            raise ValueError(f"kind must be one of {sorted(helpers)}")
        return helpers[kind](**d)

    def _actions(self) -> dict[str, Any]:
        return {
            "apps": lambda **d: {"app_id": self.add_app(**d)}, "channels": self.add_channel, "users": self.add_user,
            "files": lambda **d: self.add_file(_content(d), **{k: v for k, v in d.items()
                                                               if k not in ("content", "content_b64")}),
            "events": self._c_event, "raw": self.send_raw, "errors": self.script_error,
            "rate_limit": self.set_rate_limit, "disconnect": self.disconnect, "close": self.close, "drop": self.drop,
            "silence": self.silence, "configure": self.configure, "reset": self.reset,
        }

    async def _c_action(self, request: web.Request) -> web.Response:
        fn = self._actions().get(request.match_info["action"])
        if fn is None:
            return web.json_response({"error": "no such control action"}, status=404)
        return await _control(request, lambda d: fn(**d))

    async def _c_get(self, request: web.Request) -> web.Response:
        what, q = request.match_info["what"], request.query
        getters = {"health": lambda: {"ok": True}, "apps": lambda: [a.public() for a in self._apps],
                   "errors": lambda: self.scripted, "pending": lambda: self.pending(q.get("app"))}
        if what not in getters:
            return web.json_response({"error": "no such control endpoint"}, status=404)
        return await _control(request, lambda d: getters[what](), body=False)

    async def _c_records(self, request: web.Request) -> web.Response:
        q = dict(request.query)
        since = q.pop("since", None)
        kind = request.match_info["kind"]
        return await _control(request, lambda d: self.records(kind, since=since, **q), body=False)

    async def _c_clear_records(self, request: web.Request) -> web.Response:
        kind = request.match_info["kind"]
        return await _control(request, lambda d: self._rec[kind].clear(), body=False)

    async def _c_upload_content(self, request: web.Request) -> web.Response:
        fid = request.match_info["file_id"]
        return await _control(request, lambda d: {"content_b64": base64.b64encode(self.upload_content(fid)).decode()},
                              body=False)

    async def _c_clear_errors(self, request: web.Request) -> web.Response:
        self.clear_errors()
        return web.json_response({"ok": True})


# --- helpers -------------------------------------------------------------------------------------------------


async def _read_params(request: web.Request) -> tuple[dict[str, Any], str | None, str | None]:
    """The call's parameters (query string, then a JSON or form body), the Bearer token, a form token."""
    params: dict[str, Any] = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        if request.content_type == "application/json":
            try:
                body = json.loads(await request.read() or b"{}")
            except ValueError:
                raise ApiError("invalid_json") from None
            if not isinstance(body, dict):
                raise ApiError("invalid_json")
            body.pop("token", None)  # Slack takes a JSON call's token from the header only
            params.update(body)
        elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
            params.update({k: v for k, v in (await request.post()).items() if isinstance(v, str)})
    header = request.headers.get("Authorization", "")
    bearer = header[7:].strip() or None if header[:7].lower() == "bearer " else None
    form_token = params.pop("token", None)
    for key in ("blocks", "files", "attachments", "loading_messages"):
        if isinstance(params.get(key), str):
            try:
                params[key] = json.loads(params[key])
            except ValueError:
                pass
    return params, bearer, form_token if isinstance(form_token, str) else None


def _check_blocks(blocks: Any) -> None:
    if isinstance(blocks, str):
        raise ApiError("invalid_blocks_format")
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        raise ApiError("invalid_blocks")
    for b in blocks:
        if not isinstance(b, dict) or not isinstance(b.get("type"), str):
            raise ApiError("invalid_blocks")
        text = b.get("text")
        if b["type"] == "section" and isinstance(text, dict) and len(str(text.get("text", ""))) > MAX_SECTION_TEXT:
            raise ApiError("invalid_blocks")
        if b["type"] == "actions" and not isinstance(b.get("elements"), list):
            raise ApiError("invalid_blocks")


def _channel_param(p: dict[str, Any]) -> Any:
    return p.get("channel") or p.get("channel_id")


def _opt_str(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


def _content(d: dict[str, Any]) -> bytes:
    return base64.b64decode(d["content_b64"]) if "content_b64" in d else str(d.get("content", "")).encode()


async def _control(request: web.Request, fn: Any, *, body: bool = True) -> web.Response:
    try:
        data = await request.json() if body and request.can_read_body else {}
        if not isinstance(data, dict):
            raise TypeError("expected a JSON object")
        result = fn(data)
        return web.json_response({"ok": True} if result is None else result)
    except (ValueError, KeyError, TypeError) as e:
        return web.json_response({"error": f"{type(e).__name__}: {e}"}, status=400)


# --- as a process of its own ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fake_slack", description=__doc__.splitlines()[0])
    p.add_argument("--port-file", type=Path, required=True, help="where to write the port once listening")
    p.add_argument("--app", action="append", type=json.loads, default=[],
                   help="an app as JSON with keys of app_defaults (repeatable; default: one app)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: any free port")
    p.add_argument("--lifetime", type=float, default=900.0, help="stop after this many seconds (default 900)")
    p.add_argument("--ack-timeout", type=float, default=3.0)
    p.add_argument("--max-retries", type=int, default=3)
    p.add_argument("--loose-channels", action="store_true", help="any channel and user id is known")
    p.add_argument("--echo-bot-messages", action="store_true")
    args = p.parse_args(argv)
    try:
        fake = FakeSlack(args.app or None, host=args.host, port=args.port, ack_timeout=args.ack_timeout,
                         max_retries=args.max_retries, strict_channels=not args.loose_channels,
                         echo_bot_messages=args.echo_bot_messages)
    except (ValueError, TypeError) as e:
        p.error(str(e))
    asyncio.run(serve_until_stopped(fake, args.port_file, args.lifetime, "fake_slack"))
    return 0


def _via(action: str, *names: str, kind: str | None = None) -> Any:
    """A FakeSlackProcess method: positional arguments named `names`, POSTed to /_control/<action>."""

    def call(self: FakeSlackProcess, *args: Any, **kw: Any) -> Any:
        kw.update(zip(names, args))
        if kind is not None:
            kw["kind"] = kind
        if kw.get("files"):
            kw["files"] = [f if isinstance(f, dict) else {"name": "file.bin", "content": f} if isinstance(f, bytes)
                           else {"name": f[0], "content": f[1], "mimetype": f[2] if len(f) > 2 else None}
                           for f in kw["files"]]
            for f in kw["files"]:
                if "content" in f:
                    f["content_b64"] = base64.b64encode(f.pop("content")).decode()
                    f.update(mimetype=f.get("mimetype") or "application/octet-stream")
        return self._call("POST", f"/_control/{action}", kw)

    call.__name__ = kind or action
    return call


class FakeSlackProcess(_Shortcuts, FakeServerProcess):
    """`python -m tests.fake_slack` as a child process, for synchronous end-to-end tests; every wait bounded.

    The helpers mirror FakeSlack's through the control endpoints; file content is bytes."""

    name = "fake_slack"

    def __init__(self, workdir: Path, apps: list[dict[str, Any]] | None = None, *, ack_timeout: float = 3.0,
                 max_retries: int = 3, strict_channels: bool = True, echo_bot_messages: bool = False,
                 lifetime: float = 600.0) -> None:
        super().__init__(workdir, lifetime=lifetime)
        self.apps = [{**app_defaults(i + 1), **cfg} for i, cfg in enumerate(apps or [{}])]
        self.options = (ack_timeout, max_retries, strict_channels, echo_bot_messages)

    def extra_args(self) -> list[str]:
        ack, retries, strict, echo = self.options
        args = [a for cfg in self.apps for a in ("--app", json.dumps(cfg))]
        args += ["--ack-timeout", str(ack), "--max-retries", str(retries)]
        return args + (["--loose-channels"] if not strict else []) + (["--echo-bot-messages"] if echo else [])

    @property
    def api_base(self) -> str:
        return f"{self.url}/api"

    def __getattr__(self, name: str) -> Any:
        """bot_token, app_token, signing_secret, team_id, app_id, bot_user_id, bot_id, ...: the first app's."""
        apps = self.__dict__.get("apps")
        if apps and name in apps[0]:
            return apps[0][name]
        raise AttributeError(name)

    message = _via("events", "channel", "user", "text", kind="message")
    app_mention = _via("events", "channel", "user", "text", kind="app_mention")
    block_actions = _via("events", "channel", "user", "action_id", "value", kind="block_actions")
    slash_command = _via("events", "channel", "user", "command", "text", kind="slash_command")
    event = _via("events", "event", kind="event")
    inject = _via("events", "payload", kind="inject")
    send_raw = _via("raw", "frame")
    add_channel = _via("channels", "id")
    add_user = _via("users", "id")
    script_error = _via("errors", "method", "error")
    set_rate_limit = _via("rate_limit", "min_interval", "retry_after")
    disconnect = _via("disconnect", "reason")
    close = _via("close")
    drop = _via("drop")
    silence = _via("silence")
    configure = _via("configure")
    reset = _via("reset")

    def add_file(self, content: bytes, **kw: Any) -> dict[str, Any]:
        return self._call("POST", "/_control/files", {"content_b64": base64.b64encode(content).decode(), **kw})

    def add_app(self, **cfg: Any) -> str:
        self.apps.append({**app_defaults(len(self.apps) + 1), **cfg})
        return self._call("POST", "/_control/apps", cfg)["app_id"]

    def clear_errors(self) -> None:
        self._call("DELETE", "/_control/errors")

    def records(self, kind: str, *, since: float | None = None, **filters: Any) -> list[dict[str, Any]]:
        return self._call("GET", f"/_control/records/{kind}", query={"since": since, **filters})

    def clear_records(self, kind: str) -> None:
        self._call("DELETE", f"/_control/records/{kind}")

    def pending(self, app: str | None = None) -> list[dict[str, Any]]:
        return self._call("GET", "/_control/pending", query={"app": app})

    def upload_content(self, file_id: str) -> bytes:
        return base64.b64decode(self._call("GET", f"/_control/uploads/{file_id}")["content_b64"])

    def wait_for(self, kind: str, n: int = 1, timeout: float = 5.0, **filters: Any) -> list[dict[str, Any]]:
        """The matching records once there are at least n; TimeoutError after timeout s."""
        deadline = time.monotonic() + min(float(timeout), 600.0)
        while True:
            got = self.records(kind, **filters)
            if len(got) >= n:
                return got
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{len(got)} of {n} {kind} records after {timeout} s: {got[-3:]}")
            time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
