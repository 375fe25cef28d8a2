"""One Slack app in one workspace: Socket Mode (a WebSocket, no public URL) or the Events API over
HTTP, replies through the outbox in the conversation's thread, and an :eyes: reaction while the
agent works.

An event is acknowledged (the envelope's ack, the HTTP 200) once it is durable on this host: stored by
the writer, or, when the writer has not stored it within a second (away, restarting, its disk full),
fsynced into the gateway's spool (services/gateway/spool.py), which hands it to the writer in order as
soon as it can and at the next start. Slack redelivers an unacked envelope only 3 times over about
5 minutes, and an Events API post 3 times: without the spool a longer outage would lose events.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections import OrderedDict
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web

from common.db import read_tx
from common.errors import StarlingError
from common.log import register_secret
from common.secrets import resolve_secret
from common.stores import session_store
from services.gateway.channel import Channel, FileRef, InboundMessage
from services.gateway.slack import inbound
from services.gateway.slack.api import NetworkError, SlackApi, SlackError
from services.gateway.slack.outbound import Sender
from services.gateway.webhook import answer_after_ack

RECONNECT_S = (1.0, 60.0)
LINK_DISABLED_RETRY_S = 300.0
ACK_WITHIN_S = 2.5            # Slack wants an answer in 3 s; later, it retries (deduped)
FETCH_EVENTS_S = 1.5          # over HTTP a slow file is described, not waited for (the answer must come first)
MAX_SKEW_S = 300              # signed requests older (or newer) than this are refused
WORKING_REACTION = "eyes"
THREADS_KEPT = 10_000


class SlackChannel(Channel):
    platform = "slack"
    senders_in_groups = True  # a workspace: an allowed person is answered in any channel the bot is in
    spools = True  # Slack's retries end after minutes: acknowledged once spooled (the module's docstring)

    def __init__(self, gateway, cfg) -> None:
        super().__init__(gateway, cfg)
        self.session: aiohttp.ClientSession | None = None
        self.api: SlackApi | None = None
        self.sender: Sender | None = None
        self.me: inbound.Me | None = None
        self.app_token = ""
        self.signing_secret = ""
        self.threads: OrderedDict[str, None] = OrderedDict()  # chats (channel threads) the bot took part in
        self.tasks: set[asyncio.Task] = set()
        self.reacted: set[tuple[str, str]] = set()

    # ------------------------------------------------------------ start

    def register_webhooks(self) -> None:
        if self.cfg.mode == "events":
            self.gateway.webhooks.route(self.cfg.listen, "POST", self.events_path, self.on_request,
                                        owner=f"gateways.slack {self.id!r}")

    @property
    def events_path(self) -> str:
        return f"/slack/{self.id}/events"

    async def start(self) -> None:
        paths, key = self.gateway.paths, f"gateways.slack[{self.id}]"
        token = resolve_secret(self.cfg.bot_token, paths.secrets_file, key=f"{key}.bot_token")
        register_secret(token)
        if self.cfg.mode == "socket":
            self.app_token = resolve_secret(self.cfg.app_token, paths.secrets_file, key=f"{key}.app_token")
            register_secret(self.app_token)
        else:
            self.signing_secret = resolve_secret(self.cfg.signing_secret, paths.secrets_file,
                                                 key=f"{key}.signing_secret")
            register_secret(self.signing_secret)
        if self.session is None:
            self.session = aiohttp.ClientSession()
        self.api = SlackApi(self.cfg.api_base, token, self.session)
        self.sender = Sender(self.api, self.log, self._took_part)
        try:
            who = await self.api.call("auth.test")
            self.me = inbound.Me(str(who["user_id"]), str(who.get("bot_id") or ""), str(who.get("team_id") or ""))
        except (SlackError, NetworkError, KeyError) as exc:
            raise StarlingError(f"Slack at {self.cfg.api_base}: {exc} (check the bot token's secret)") from None
        self.status = "events" if self.cfg.mode == "events" else "socket: connecting"
        self.log.info("slack_ready", mode=self.cfg.mode, bot_user=self.me.user_id, team=self.me.team_id)
        if self.cfg.mode == "socket":
            self.log.info("socket_mode_note", detail="every connection of one app gets a share of its events:"
                          " run one gateway per Slack app (or accept that the events are split)")

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    # ------------------------------------------------------------ Socket Mode

    async def receive(self) -> None:
        if self.cfg.mode == "events":
            await asyncio.Event().wait()  # requests come to on_request
        delay = RECONNECT_S[0]
        while True:
            reason = await self._connect_once()
            if reason == "hello":  # it worked for a while: start the backoff over
                delay = RECONNECT_S[0]
                continue
            if reason in ("refresh_requested", "warning"):
                continue  # Slack asks for a new connection now
            if reason == "link_disabled":
                self.log.error("socket_mode_disabled", detail="Slack disabled Socket Mode for this app;"
                               " enable it in the app's settings", retry_in_s=LINK_DISABLED_RETRY_S)
                await asyncio.sleep(LINK_DISABLED_RETRY_S)
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_S[1])

    async def _connect_once(self) -> str:
        """One connection's life; what ended it: a disconnect reason, "hello" (it was up, then dropped),
        or "failed"."""
        try:
            opened = await self.api.call("apps.connections.open", token=self.app_token)
            url = str(opened["url"])
        except (SlackError, NetworkError, KeyError) as exc:
            self.status = f"socket: cannot connect ({exc})"
            self.log.warning("socket_open_failed", error=str(exc))
            return "failed"
        greeted = False
        try:
            async with self.session.ws_connect(url, heartbeat=self.cfg.ping_interval_s, max_msg_size=8 * 1024 * 1024) as ws:
                async for frame in ws:
                    if frame.type != aiohttp.WSMsgType.TEXT:
                        continue
                    try:
                        data = json.loads(frame.data)
                    except (ValueError, RecursionError):
                        self.log.warning("socket_frame_skipped", reason="not JSON")
                        continue
                    if not isinstance(data, dict):
                        continue
                    if data.get("type") == "hello":
                        greeted = True
                        self.status = f"socket: connected as {self.me.user_id}"
                        self.log.info("socket_hello", connections=data.get("num_connections"))
                    elif data.get("type") == "disconnect":
                        reason = str(data.get("reason") or "")
                        self.log.info("socket_disconnect", reason=reason)
                        if self.tasks:  # Slack warns ahead: let envelopes under way ack on this socket first
                            await asyncio.wait(list(self.tasks), timeout=ACK_WITHIN_S)
                        return reason or ("hello" if greeted else "failed")
                    elif isinstance(data.get("envelope_id"), str):
                        task = asyncio.create_task(self._envelope(ws, data))
                        self.tasks.add(task)  # the loop holds tasks weakly: keep each until it is done
                        task.add_done_callback(self.tasks.discard)
                close_code = ws.close_code
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            # not str(exc): a failed handshake's text holds the connection URL and its one-time ticket
            self.log.warning("socket_failed", error=type(exc).__name__, status=getattr(exc, "status", None))
            return "hello" if greeted else "failed"
        self.status = "socket: reconnecting"
        self.log.warning("socket_closed", code=close_code, detail="closed or no pong in time; reconnecting")
        return "hello" if greeted else "failed"

    async def _envelope(self, ws: aiohttp.ClientWebSocketResponse, envelope: dict) -> None:
        """Ack one envelope once it is durable (stored, or spooled); unacked, Slack sends it again (deduped)."""
        try:
            durable = await self.take(envelope.get("type"), envelope.get("payload"))
        except Exception as exc:  # a bug on one envelope must not kill the socket; Slack will resend it
            self.log.error("envelope_failed", envelope=envelope.get("envelope_id"), error=repr(exc))
            return
        if not durable:
            self.log.warning("inbound_not_acked", envelope=envelope.get("envelope_id"),
                             error="neither stored nor spooled")
            return
        if envelope.get("retry_attempt"):
            self.log.info("envelope_redelivered", retry_attempt=envelope.get("retry_attempt"),
                          reason=envelope.get("retry_reason"))
        try:
            await ws.send_json({"envelope_id": envelope["envelope_id"]})
        except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
            self.log.info("ack_lost", envelope=envelope.get("envelope_id"), error=str(exc))

    # ------------------------------------------------------------ both transports

    async def take(self, kind: object, payload: object) -> bool:
        """True once the event is durable on this host (stored by the writer, or spooled)."""
        event = {"kind": kind, "payload": payload}
        return await self.gateway.spool.take(self.id, _event_key(kind, payload), event,
                                             lambda: self.gateway.take(self, event))

    # ------------------------------------------------------------ inbound, for the kit

    def parse(self, event: object):
        return inbound.parse(event, self.me, self.id)

    def addressed(self, msg: InboundMessage) -> bool:
        # judged once the earlier events of this conversation are stored: a reply that came right
        # behind the mention starting its thread belongs to that thread too
        return msg.addressed or (bool(msg.thread) and not msg.private and self._in_thread(msg.chat))

    async def download(self, ref: FileRef):
        return self.api.download(ref.ref)

    def fetch_budget_s(self) -> float:
        return FETCH_EVENTS_S if self.cfg.mode == "events" else 120.0

    def stored(self, msg: InboundMessage) -> None:
        if not msg.private:
            self._took_part(msg.chat)

    def _took_part(self, chat: str) -> None:
        self.threads[chat] = None
        self.threads.move_to_end(chat)
        while len(self.threads) > THREADS_KEPT:
            self.threads.popitem(last=False)

    def _in_thread(self, chat: str) -> bool:
        """Whether the bot takes part in a channel thread: it posted there, or has a conversation there."""
        if chat in self.threads:
            return True
        with read_tx(self.gateway.reader) as conn:
            return session_store.mapped(conn, self.agent, self.id, chat) is not None

    # ------------------------------------------------------------ Events API over HTTP

    def signed(self, raw: bytes, timestamp: str, signature: str, now: float | None = None) -> bool:
        """Slack's v0 signature: HMAC-SHA256 of ``v0:<timestamp>:<raw body>`` with the signing secret,
        compared in constant time; a timestamp more than 5 minutes off is refused (replays)."""
        try:
            stamp = int(timestamp)
        except ValueError:
            return False
        if abs((time.time() if now is None else now) - stamp) > MAX_SKEW_S or not self.signing_secret:
            return False
        expected = "v0=" + hmac.new(self.signing_secret.encode(), b"v0:" + timestamp.encode() + b":" + raw,
                                    hashlib.sha256).hexdigest()
        return signature.isascii() and hmac.compare_digest(expected.encode(), signature.encode())

    async def on_request(self, request: web.Request) -> web.Response:
        raw = await self.gateway.webhooks.read_body(request)  # bounded: size, time, unverified at once
        if not self.signed(raw, request.headers.get("X-Slack-Request-Timestamp", ""),
                           request.headers.get("X-Slack-Signature", "")):
            self.log.warning("request_refused", reason="bad or stale signature", peer=request.remote)
            return web.Response(status=401)
        kind, payload = _decode(raw, request.content_type)
        if kind is None:
            self.log.warning("event_skipped", reason="body is neither an event nor a form Slack sends")
            return web.Response(status=400)
        if kind == "url_verification":
            return web.json_response({"challenge": payload.get("challenge", "")})
        if request.headers.get("X-Slack-Retry-Num"):
            self.log.info("event_redelivered", retry=request.headers.get("X-Slack-Retry-Num"),
                          reason=request.headers.get("X-Slack-Retry-Reason"))
        return await answer_after_ack(self._take_or_raise(kind, payload), ACK_WITHIN_S, self.log)

    async def _take_or_raise(self, kind: object, payload: object) -> None:
        if not await self.take(kind, payload):
            raise asyncio.TimeoutError  # neither stored nor spooled: 503, and Slack retries

    # ------------------------------------------------------------ send

    def outbound(self) -> Sender | None:
        return self.sender

    async def typing(self, chat: str, platform_msg_id: str) -> None:
        channel, _ = inbound.target(chat)
        if self.sender is None or not platform_msg_id or (channel, platform_msg_id) in self.reacted:
            return
        self.reacted.add((channel, platform_msg_id))
        await self.sender.call("reactions.add", {"channel": channel, "timestamp": platform_msg_id,
                                                 "name": WORKING_REACTION})

    async def typing_done(self, chat: str, platform_msg_id: str) -> None:
        channel, _ = inbound.target(chat)
        if self.sender is None or (channel, platform_msg_id) not in self.reacted:
            return
        self.reacted.discard((channel, platform_msg_id))
        await self.sender.call("reactions.remove", {"channel": channel, "timestamp": platform_msg_id,
                                                    "name": WORKING_REACTION})


def _event_key(kind: object, payload: object) -> str:
    """The event's own id, the same in every redelivery (the spool waits for a copy it holds)."""
    if not isinstance(payload, dict):
        return ""
    for field in ("event_id", "trigger_id"):
        if isinstance(payload.get(field), str):
            return f"{kind}:{payload[field]}"
    actions = payload.get("actions")
    if isinstance(actions, list) and actions and isinstance(actions[0], dict):
        user = payload.get("user")
        return f"{kind}:{actions[0].get('action_ts')}:{user.get('id', '') if isinstance(user, dict) else ''}"
    return ""


def _decode(raw: bytes, content_type: str) -> tuple[str | None, dict]:
    """(kind, payload) of an Events API request: JSON events, or the forms of interactivity and
    slash commands."""
    try:
        if content_type == "application/x-www-form-urlencoded":
            form = {k: v[0] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}
            if "payload" in form:
                payload = json.loads(form["payload"])
                return ("interactive", payload) if isinstance(payload, dict) else (None, {})
            return ("slash_commands", form) if "command" in form else (None, {})
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None, {}
    if not isinstance(body, dict) or not isinstance(body.get("type"), str):
        return None, {}
    return body["type"], body
