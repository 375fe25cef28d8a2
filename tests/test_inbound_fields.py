"""Typed inbound fields (schema Inbound: thread, chat_kind, reply_to, edit_of, sent_at), no free `meta`
dict: what each platform's parser says of a message, and the writer storing them in their own columns."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from common import db
from common.stores import turn_store
from schema import messages as m
from services.gateway.slack import inbound as slack
from services.gateway.telegram import inbound as telegram
from services.gateway.whatsapp import inbound as whatsapp
from services.writer import apply as ops

ME = telegram.Me(1, "starling_bot")
SLACK_ME = slack.Me("UBOT", "BBOT", "T1")


def fields(msg) -> tuple:
    return (msg.thread, msg.chat_kind, msg.reply_to, msg.edit_of, msg.sent_at)


def test_telegram_a_forum_topic_reply_and_an_edit():
    quoted = {"message_id": 40, "from": {"id": 9}, "text": "earlier"}
    topic = {"update_id": 7, "message": {"message_id": 41, "date": 1_700_000_000, "text": "@starling_bot hi",
                                         "chat": {"id": -100, "type": "supergroup"}, "from": {"id": 5},
                                         "message_thread_id": 3, "is_topic_message": True,
                                         "reply_to_message": quoted}}
    edit = {"update_id": 8, "edited_message": {"message_id": 41, "date": 1_700_000_000, "edit_date": 1_700_000_060,
                                               "text": "fixed", "chat": {"id": 5, "type": "private"},
                                               "from": {"id": 5}}}
    first, second = telegram.parse(topic, ME, "tg").msg, telegram.parse(edit, ME, "tg").msg
    assert ("-100:3", ("3", "group", "40", "", 1_700_000_000.0)) == (first.chat, fields(first))
    assert ("", "private", "", "41", 1_700_000_060.0) == fields(second)


def test_slack_a_reply_in_a_channel_thread_and_a_dm():
    def event(channel: str, channel_type: str, **extra) -> dict:
        return {"kind": "events_api", "payload": {
            "type": "event_callback", "event_id": f"Ev{channel}",
            "event": {"type": "message", "channel": channel, "channel_type": channel_type, "user": "U1",
                      "text": "hello", "ts": "1700000001.000200", **extra}}}

    in_thread = slack.parse(event("C1", "channel", thread_ts="1700000000.000100"), SLACK_ME, "sl").msg
    dm = slack.parse(event("D1", "im"), SLACK_ME, "sl").msg
    assert ("1700000000.000100", "group", "", "", 1700000001.0002) == fields(in_thread)
    assert ("", "private", "", "", 1700000001.0002) == fields(dm)


def test_whatsapp_the_timestamp_and_the_message_answered():
    value = {"contacts": [{"wa_id": "4915100", "profile": {"name": "Ann"}}],
             "messages": [{"from": "4915100", "id": "wamid.1", "timestamp": "1700000002", "type": "text",
                           "text": {"body": "hi"}, "context": {"id": "wamid.0"}}]}
    [event] = whatsapp.messages(value)
    msg = whatsapp.parse(event, "wa").msg
    assert ("Ann", ("", "private", "wamid.0", "", 1700000002.0)) == (msg.sender_name, fields(msg))


@pytest.fixture
def conn(tmp_path: Path, migrated_file: Path):
    shutil.copyfile(migrated_file, tmp_path / "starling.db")
    c = db.open_writer(tmp_path / "starling.db")
    yield c
    c.close()


def test_the_writer_stores_them_in_their_own_columns_and_refuses_an_unknown_chat_kind(conn):
    op = m.Inbound(agent="default", instance="tg", chat="-100:3", sender="5", dedupe_keys=["tg:tg:m:-100:41"],
                   text="hi", reply_to="40", thread="3", chat_kind="group", edit_of="", sent_at=1_700_000_000.0)
    accepted = ops.apply(conn, op, 1_700_000_005.0, [])
    stored = turn_store.inbound_fields(conn, accepted.turn_id)
    assert turn_store.InboundFields("3", "group", "", 1_700_000_000.0, "40") == stored
    assert "{}" == turn_store.get(conn, accepted.turn_id).meta  # the runner's column holds no gateway details
    with pytest.raises(ops.Rejected, match="chat_kind"):
        ops.apply(conn, m.Inbound(agent="default", instance="tg", chat="9", sender="9", dedupe_keys=["k9"],
                                  chat_kind="room"), 1_700_000_005.0, [])
