"""Slack payloads as inbound messages. Conversations: one per DM (the channel), one per channel
thread (`<channel>:<thread ts>`; a mention outside a thread starts one). Pure functions over the
payload's JSON; anything malformed or not for the agent is a Skip with a reason."""

from __future__ import annotations

import re
from typing import Any, Callable, NamedTuple

from common import chat_commands
from services.gateway.channel import FileRef, InboundMessage, Parsed, Skip

HANDLED_SUBTYPES = (None, "", "file_share", "thread_broadcast")
_LEADING_MENTION = re.compile(r"^\s*<@[A-Z0-9]+>[\s,:]*")


class Me(NamedTuple):
    user_id: str
    bot_id: str
    team_id: str


def chat_of(channel: str, thread_ts: str, private: bool) -> str:
    return channel if private else f"{channel}:{thread_ts}"


def target(chat: str) -> tuple[str, str]:
    """(channel, thread_ts or "") to post to for a chat key."""
    channel, _, thread = chat.partition(":")
    return channel, thread


def parse(event: Any, me: Me, instance: str) -> Parsed | Skip:
    """An event as the channel takes (and spools) it: {"kind": the envelope's type, "payload"}."""
    kind, payload = (event.get("kind"), event.get("payload")) if isinstance(event, dict) else (None, None)
    if kind in ("events_api", "event_callback"):
        return parse_event(payload, me, instance)
    if kind == "slash_commands":
        return parse_command(payload, instance)
    if kind == "interactive":
        return parse_action(payload, instance)
    return Skip(f"envelope type {kind!r} is not handled")


def parse_event(payload: Any, me: Me, instance: str, in_thread: Callable[[str], bool] = lambda chat: False
                ) -> Parsed | Skip:
    """An Events API `event_callback` (from Socket Mode or HTTP). A reply in a channel thread is addressed
    when the bot takes part in it: ``in_thread``, or SlackChannel.addressed once earlier events are stored."""
    if not isinstance(payload, dict) or payload.get("type") != "event_callback":
        return Skip(f"payload type {payload.get('type') if isinstance(payload, dict) else None!r} is not handled")
    event = payload.get("event")
    event_id = payload.get("event_id")
    if not isinstance(event, dict) or not isinstance(event_id, str):
        return Skip("event_callback without an event or event_id")
    kind = event.get("type")
    if kind not in ("message", "app_mention"):
        return Skip(f"event type {kind!r} is not handled")
    if event.get("subtype") not in HANDLED_SUBTYPES:
        return Skip(f"message subtype {event.get('subtype')!r} is not handled")
    if event.get("bot_id") or event.get("user") == me.user_id:
        return Skip("a bot's message (this one's or another's)")
    channel, user, ts = event.get("channel"), event.get("user"), event.get("ts")
    if not all(isinstance(v, str) and v for v in (channel, user, ts)):
        return Skip("message without a channel, user or ts")
    text = event.get("text") if isinstance(event.get("text"), str) else ""
    private = event.get("channel_type") == "im" or (kind == "message" and channel.startswith("D"))
    thread_ts = event.get("thread_ts") if isinstance(event.get("thread_ts"), str) else ""
    chat = chat_of(channel, thread_ts or ts, private)
    mention = f"<@{me.user_id}>"
    addressed = private or kind == "app_mention" or mention in text or (bool(thread_ts) and in_thread(chat))
    text = _LEADING_MENTION.sub("", text, count=1) if text.lstrip().startswith(mention) else text
    msg = InboundMessage(
        chat=chat, sender=user, text=text.strip(), private=private, addressed=addressed, platform_msg_id=ts,
        dedupe_keys=[f"slack:{instance}:e:{event_id}", f"slack:{instance}:m:{channel}:{ts}"],
        room="" if private else channel, thread=thread_ts,
        chat_kind="private" if private else "group", sent_at=_float(ts),
    )
    return Parsed(msg, _files(event))


def parse_command(payload: Any, instance: str) -> Parsed | Skip:
    """A slash command (`/new`, `/status`, ...) registered for the app."""
    if not isinstance(payload, dict):
        return Skip("slash command payload is not an object")
    command, user, channel = payload.get("command"), payload.get("user_id"), payload.get("channel_id")
    trigger = payload.get("trigger_id")
    if not all(isinstance(v, str) and v for v in (command, user, channel, trigger)):
        return Skip("slash command without a command, user, channel or trigger")
    private = channel.startswith("D")
    text = f"{command} {payload.get('text') or ''}".strip()
    msg = InboundMessage(chat=channel, sender=user, text=text, private=private, addressed=True,
                         dedupe_keys=[f"slack:{instance}:c:{trigger}"], room="" if private else channel)
    return Parsed(msg)


def parse_action(payload: Any, instance: str) -> Parsed | Skip:
    """A click on an approval button: the same as writing /approve ID (or /deny ID) in that conversation."""
    if not isinstance(payload, dict) or payload.get("type") != "block_actions":
        return Skip("interactive payload is not block_actions")
    user = (payload.get("user") or {}).get("id") if isinstance(payload.get("user"), dict) else None
    channel = (payload.get("channel") or {}).get("id") if isinstance(payload.get("channel"), dict) else None
    message = payload.get("message") if isinstance(payload.get("message"), dict) else {}
    actions = payload.get("actions") if isinstance(payload.get("actions"), list) else []
    action = actions[0] if actions and isinstance(actions[0], dict) else {}
    approve = {"starling_approve": True, "starling_deny": False}.get(action.get("action_id"))
    value, action_ts = action.get("value"), action.get("action_ts")
    if not (isinstance(user, str) and isinstance(channel, str) and approve is not None and isinstance(value, str)
            and isinstance(action_ts, str)):
        return Skip("block action that is not an approval button")
    private = channel.startswith("D")
    thread = message.get("thread_ts") or message.get("ts") or ""
    chat = chat_of(channel, str(thread), private)
    msg = InboundMessage(chat=chat, sender=user, text=chat_commands.decide_text(approve, value), private=private,
                         addressed=True,
                         dedupe_keys=[f"slack:{instance}:a:{channel}:{action_ts}:{user}"],
                         room="" if private else channel, thread="" if private else str(thread),
                         sent_at=_float(str(action_ts)))
    return Parsed(msg)


def _files(event: dict) -> list[FileRef]:
    refs = []
    for f in event.get("files") if isinstance(event.get("files"), list) else []:
        if isinstance(f, dict) and isinstance(f.get("url_private_download") or f.get("url_private"), str):
            mime = f.get("mimetype") if isinstance(f.get("mimetype"), str) else ""
            kind = "image" if mime.startswith("image/") else "audio" if mime.startswith("audio/") else "file"
            size = f.get("size") if isinstance(f.get("size"), int) else 0
            refs.append(FileRef(kind, f.get("url_private_download") or f["url_private"], size,
                                str(f.get("name") or f.get("id") or "file")))
    return refs


def _float(ts: str) -> float:
    try:
        return float(ts)
    except ValueError:
        return 0.0
