"""Telegram updates as inbound messages: who, where, what, whether the bot was addressed, and which
files to fetch. Pure functions over the update's JSON; anything malformed is a Skip with a reason."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from common import chat_commands
from services.gateway.channel import FileRef, InboundMessage, Parsed, Skip

HANDLED = ("message", "edited_message")
_CHAT_KINDS = {"private": "private", "group": "group", "supergroup": "group", "channel": "channel"}
QUOTE_CHARS = 300


class Me(NamedTuple):
    id: int
    username: str


def parse(update: Any, me: Me, instance: str) -> Parsed | Skip:
    if not isinstance(update, dict) or not isinstance(update.get("update_id"), int):
        return Skip("not an update")
    kind = next((k for k in update if k != "update_id"), "")
    if kind not in HANDLED:
        return Skip(f"update type {kind or 'none'!r} is not handled")
    msg = update[kind]
    chat = msg.get("chat") if isinstance(msg, dict) else None
    sender = msg.get("from") if isinstance(msg, dict) else None
    if not isinstance(chat, dict) or not isinstance(chat.get("id"), int) or not isinstance(msg.get("message_id"), int):
        return Skip("message without a chat or id")
    if not isinstance(sender, dict) or not isinstance(sender.get("id"), int):
        return Skip("message without a sender (a channel post?)")
    if sender.get("is_bot") and sender["id"] == me.id:
        return Skip("the bot's own message")
    chat_id, message_id = chat["id"], msg["message_id"]
    text = _str(msg.get("text")) or _str(msg.get("caption"))
    entities = msg.get("entities") or msg.get("caption_entities") or []
    private = chat.get("type") == "private"
    addressed, text, command = _addressing(text, entities if isinstance(entities, list) else [], msg, me, private)
    # keyed by the message, not the update id: after a week without updates Telegram starts update ids
    # afresh (at random), so an old update's key could match a new message
    date = msg.get("date") if isinstance(msg.get("date"), (int, float)) else 0
    edit_of = ""
    if kind == "edited_message":
        edit = msg.get("edit_date") if isinstance(msg.get("edit_date"), int) else update["update_id"]
        keys = [f"tg:{instance}:e:{chat_id}:{message_id}:{edit}"]
        text = "[edited] " + text
        edit_of = str(message_id)
        date = msg["edit_date"] if isinstance(msg.get("edit_date"), int) else date
    else:
        keys = [f"tg:{instance}:m:{chat_id}:{message_id}"]
    reply_to = ""
    quoted = msg.get("reply_to_message")
    if isinstance(quoted, dict) and isinstance(quoted.get("message_id"), int):
        reply_to = str(quoted["message_id"])
        said = (_str(quoted.get("text")) or _str(quoted.get("caption")))[:QUOTE_CHARS]
        if said and not command and not text.startswith("/"):
            text = f"[in reply to: {said}]\n{text}"
    # a forum supergroup's topics are conversations of their own: "<chat id>:<topic id>"
    topic = msg.get("message_thread_id") if msg.get("is_topic_message") is True else None
    topical = isinstance(topic, int) and not private
    conversation = f"{chat_id}:{topic}" if topical else str(chat_id)
    inbound = InboundMessage(
        chat=conversation, room=str(chat_id), sender=str(sender["id"]), text=text, dedupe_keys=keys, private=private,
        addressed=addressed, sender_name=_name(sender), platform_msg_id=str(message_id), reply_to=reply_to,
        command=command, thread=str(topic) if topical else "", chat_kind=_CHAT_KINDS.get(chat.get("type"), "group"),
        edit_of=edit_of, sent_at=float(date),
    )
    return Parsed(inbound, _files(msg))


def _addressing(text: str, entities: list, msg: dict, me: Me, private: bool) -> tuple[bool, str, str]:
    """(addressed, text with the bot's @name taken off, the gateway's own command or "")."""
    mention = f"@{me.username}".lower() if me.username else ""
    addressed = private
    command = ""
    words = text.split(maxsplit=1)
    if words and words[0].startswith("/"):
        name, _, target = words[0].partition("@")
        if target and target.lower() != me.username.lower():
            return False, text, ""  # a command for another bot in the group
        addressed = True
        rest = words[1] if len(words) > 1 else ""
        text = f"{name} {rest}".strip()
        if name.lower() == chat_commands.START:
            command = chat_commands.START
    for ent in entities:
        if not isinstance(ent, dict):
            continue
        if ent.get("type") == "text_mention" and isinstance(ent.get("user"), dict) and ent["user"].get("id") == me.id:
            addressed = True
    if mention and re.search(rf"(?<![\w@]){re.escape(mention)}(?!\w)", text, re.IGNORECASE):
        addressed = True  # "@mybot", not "@mybot_fan"
        if text.lower().startswith(mention):
            text = text[len(mention):].lstrip(" ,:")
    quoted = msg.get("reply_to_message")
    if isinstance(quoted, dict) and isinstance(quoted.get("from"), dict) and quoted["from"].get("id") == me.id:
        addressed = True
    return addressed, text, command


def _files(msg: dict) -> list[FileRef]:
    files: list[FileRef] = []
    photo = msg.get("photo")
    if isinstance(photo, list) and photo:
        best = photo[-1]  # Telegram lists sizes smallest first
        if isinstance(best, dict) and best.get("file_id"):
            files.append(FileRef("photo", _str(best["file_id"]), _int(best.get("file_size")),
                                 f"photo-{_str(best.get('file_unique_id')) or 'image'}.jpg"))
    for kind in ("document", "voice", "audio", "video", "video_note", "animation"):
        item = msg.get(kind)
        if isinstance(item, dict) and item.get("file_id"):
            default = f"{kind}-{_str(item.get('file_unique_id')) or 'file'}" + (".oga" if kind == "voice" else "")
            files.append(FileRef(kind, _str(item["file_id"]), _int(item.get("file_size")),
                                 _str(item.get("file_name")) or default))
    return files


def _name(user: dict) -> str:
    full = " ".join(p for p in (_str(user.get("first_name")), _str(user.get("last_name"))) if p)
    return full or _str(user.get("username"))


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value > 0 else 0
