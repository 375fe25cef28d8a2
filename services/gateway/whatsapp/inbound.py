"""WhatsApp Cloud API webhook payloads: messages as inbound messages, statuses as delivery records.
Pure functions over the payload's JSON; anything malformed or unknown is a Skip with a reason."""

from __future__ import annotations

from typing import Any, NamedTuple

from services.gateway.channel import FileRef, InboundMessage, Parsed, Skip

MEDIA_KINDS = ("image", "audio", "document", "video", "sticker")
STATUSES = ("sent", "delivered", "read", "failed")


class Status(NamedTuple):
    wamid: str
    status: str
    error: str


def values(payload: Any, phone_number_id: str) -> list[dict] | Skip:
    """The `value` objects of a webhook POST, those for this number first. A value for another number
    of the same app is returned too, marked with ``"_other_number"``: the caller says so, then skips it."""
    if not isinstance(payload, dict) or payload.get("object") != "whatsapp_business_account":
        return Skip("not a whatsapp_business_account payload")
    out = []
    for entry in _list(payload.get("entry")):
        for change in _list(entry.get("changes")) if isinstance(entry, dict) else []:
            value = change.get("value") if isinstance(change, dict) else None
            if not isinstance(value, dict):
                continue
            meta = value.get("metadata") if isinstance(value.get("metadata"), dict) else {}
            if meta.get("phone_number_id") not in (None, phone_number_id):
                out.append({"_other_number": str(meta.get("phone_number_id"))})
                continue
            out.append(value)
    return out


def messages(value: dict) -> list[dict]:
    """The messages of a `value`, each an event of its own as the kit takes it (Gateway.take, and dead
    letters keep it): {"message": the message object, "name": its sender's profile name}."""
    names = {c.get("wa_id"): ((c.get("profile") or {}).get("name") or "") for c in _list(value.get("contacts"))
             if isinstance(c, dict) and isinstance(c.get("profile"), dict)}
    return [{"message": m, "name": str(names.get(m.get("from")) or "") if isinstance(m, dict) else ""}
            for m in _list(value.get("messages"))]


def parse(event: Any, instance: str) -> Parsed | Skip:
    if not isinstance(event, dict):
        return Skip("a message event that is not an object")
    return _message(event.get("message"), str(event.get("name") or ""), instance)


def statuses(value: dict) -> list[Status | Skip]:
    out: list[Status | Skip] = []
    for st in _list(value.get("statuses")):
        if not isinstance(st, dict) or not isinstance(st.get("id"), str) or st.get("status") not in STATUSES:
            out.append(Skip("a status without an id or with an unknown status"))
            continue
        errors = st.get("errors") if isinstance(st.get("errors"), list) else []
        error = "; ".join(f"{e.get('code')} {e.get('title') or e.get('message') or ''}".strip()
                          for e in errors if isinstance(e, dict))
        out.append(Status(st["id"], st["status"], error))
    return out


def _message(msg: Any, name: str, instance: str) -> Parsed | Skip:
    if not isinstance(msg, dict):
        return Skip("a message that is not an object")
    wamid, sender, kind = msg.get("id"), msg.get("from"), msg.get("type")
    if not (isinstance(wamid, str) and wamid and isinstance(sender, str) and sender.isdigit()):
        return Skip("a message without an id or a sender number")
    text, files = "", []
    if kind == "text" and isinstance(msg.get("text"), dict):
        text = str(msg["text"].get("body") or "")
    elif kind in MEDIA_KINDS and isinstance(msg.get(kind), dict) and isinstance(msg[kind].get("id"), str):
        media = msg[kind]
        text = str(media.get("caption") or "")
        kind_name = "voice note" if kind == "audio" and media.get("voice") else kind
        name = str(media.get("filename") or f"{kind}-{media['id']}{_ext(str(media.get('mime_type') or ''))}")
        files.append(FileRef(kind_name, media["id"], 0, name))
    elif kind == "button" and isinstance(msg.get("button"), dict):
        text = str(msg["button"].get("text") or "")
    elif kind == "interactive" and isinstance(msg.get("interactive"), dict):
        reply = msg["interactive"].get("button_reply") or msg["interactive"].get("list_reply") or {}
        text = str(reply.get("title") or "") if isinstance(reply, dict) else ""
    else:
        return Skip(f"message type {kind!r} is not handled")
    context = msg.get("context") if isinstance(msg.get("context"), dict) else {}
    reply_to = str(context.get("id") or "")
    try:
        sent_at = float(msg.get("timestamp") or 0)  # whole seconds, as a string
    except (TypeError, ValueError):
        sent_at = 0.0
    inbound = InboundMessage(
        chat=sender, sender=sender, text=text, dedupe_keys=[f"wa:{instance}:m:{wamid}"], private=True,
        sender_name=name, platform_msg_id=wamid, reply_to=reply_to, chat_kind="private", sent_at=sent_at,
    )
    return Parsed(inbound, files)


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []  # a malformed field is no items, never a crash


def _ext(mime: str) -> str:
    return {"image/jpeg": ".jpg", "image/png": ".png", "image/webp": ".webp", "audio/ogg": ".ogg",
            "audio/mpeg": ".mp3", "video/mp4": ".mp4", "application/pdf": ".pdf"}.get(mime.split(";")[0].strip(), "")
