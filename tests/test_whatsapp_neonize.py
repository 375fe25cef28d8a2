"""The neonize adapter, offline: what can run without WhatsApp's servers. Skipped where neonize is not
installed (`pip install -e '.[whatsapp-linked]'`). Nothing here connects: no test may leave 127.0.0.1."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

neonize = pytest.importorskip("neonize")

from neonize.aioze.client import ClientFactory  # noqa: E402
from neonize.proto import Neonize_pb2 as proto  # noqa: E402

from services.gateway.whatsapp.linked import LogoutReason, SendKind  # noqa: E402
from services.gateway.whatsapp.neonize_client import (  # noqa: E402
    NeonizeClient, _logout_reason, _send_error, require_neonize,
)
from services.gateway.whatsapp.session_vault import SessionVault, derive_key  # noqa: E402
from services.gateway.whatsapp.working_copy import DB_KEY  # noqa: E402


class _Log:
    def bind(self, **_kw):
        return self

    def info(self, *a, **kw):
        pass

    debug = warning = error = info


def client(tmp_path) -> NeonizeClient:
    vault = SessionVault(tmp_path / "whatsapp" / "wa", derive_key(b"k", "wa"), "wa")
    return NeonizeClient("wa", vault, SimpleNamespace(), _Log())


def test_the_library_loads_and_the_client_registers_its_handlers(tmp_path):
    require_neonize()
    c = client(tmp_path)
    built = c._build()  # restores the working copy and registers handlers; connects nothing
    assert len(built.event.list_func) >= 8
    assert c.copy.folder.is_dir() and str(c.copy.folder).startswith("/dev/shm/")
    c.copy.wipe()


def test_whatsmeows_own_database_goes_through_the_encrypted_store(tmp_path):
    c = client(tmp_path)
    c.copy.restore()
    assert [] == ClientFactory.get_all_devices_from_db(str(c.copy.db))  # the Go core creates its schema
    plain = c.copy.db.read_bytes()
    assert plain.startswith(b"SQLite format 3") and b"whatsmeow_device" in plain
    assert c.copy.save()
    assert b"whatsmeow_device" not in (c.store.folder / f"{DB_KEY}.enc").read_bytes()
    c.copy.wipe()
    again = client(tmp_path)
    assert again.copy.restore()
    assert plain == again.copy.db.read_bytes()
    assert [] == ClientFactory.get_all_devices_from_db(str(again.copy.db))  # the Go core opens it again
    again.copy.wipe()


def test_a_received_message_is_mapped(tmp_path):
    c = client(tmp_path)
    c.me = "4915199990000"
    event = proto.Message()
    src = event.Info.MessageSource
    src.Chat.User, src.Chat.Server = "120363025246125888", "g.us"
    src.Sender.User, src.Sender.Server = "4915112345678", "s.whatsapp.net"
    src.IsGroup = True
    event.Info.ID, event.Info.Pushname, event.Info.Timestamp = "3EB0ABC", "Ann", 1700000000
    event.Message.extendedTextMessage.text = "@4915199990000 hi"
    event.Message.extendedTextMessage.contextInfo.mentionedJID.append("4915199990000@s.whatsapp.net")
    event.Message.extendedTextMessage.contextInfo.stanzaID = "3EB0PREV"
    msg = c._map(event)
    assert ("3EB0ABC", "120363025246125888@g.us", "4915112345678", "@4915199990000 hi", True, True, "3EB0PREV") == (
        msg.id, msg.chat, msg.sender, msg.text, msg.group, msg.mentions_me, msg.reply_to)
    voice = proto.Message()
    voice.Info.MessageSource.Chat.User = voice.Info.MessageSource.Sender.User = "4915112345678"
    voice.Info.ID = "3EB0V"
    voice.Message.audioMessage.PTT = True
    assert "voice note" == c._map(voice).kind


def test_library_errors_map_to_send_kinds():
    assert SendKind.NETWORK is _send_error(Exception("websocket not connected")).kind
    assert SendKind.RATE_LIMITED is _send_error(Exception("server returned error 429: rate-overlimit")).kind
    assert SendKind.REJECTED is _send_error(Exception("something new")).kind
    assert LogoutReason.DEVICE_REMOVED is _logout_reason(2)
    assert LogoutReason.MAIN_DEVICE_GONE is _logout_reason(4)


def test_sending_without_a_connection_is_not_connected(tmp_path):
    from services.gateway.whatsapp.linked import SendError

    c = client(tmp_path)
    with pytest.raises(SendError) as err:
        asyncio.run(c.send_text("4915112345678", "hi"))
    assert SendKind.NOT_CONNECTED is err.value.kind
