"""The first rule of durability, on every gateway: nothing is acknowledged to the platform before it is
durable on this host. The writer is paused (SIGSTOP) while a message comes in: no confirmed offset, no
200 may go out meanwhile; Slack, whose retries end within minutes, gets its ack once the event is in
the gateway's spool (fsynced), and not before. Once the writer resumes, the message is stored once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

from common.held_files import read_spool
from services.gateway import spool
from tests.fake_whatsapp import DEFAULT_APP_SECRET, DEFAULT_PHONE_NUMBER_ID, message_payload, sign
from tests.procs import wait_until
from tests.slack_stack import OWNER as SLACK_OWNER
from tests.slack_stack import slack_stack
from tests.telegram_stack import OWNER as TG_OWNER
from tests.telegram_stack import stack as telegram_stack
from tests.test_whatsapp_gateway import post_raw
from tests.whatsapp_stack import OWNER as WA_OWNER
from tests.whatsapp_stack import whatsapp_stack

PAUSE_S = 1.5


@contextlib.contextmanager
def writer_paused(s):
    os.kill(s.writer.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(s.writer.pid, signal.SIGCONT)


def user_turns(s, instance: str, chat: str) -> list[str]:
    return s.user_turns(instance, chat)


def test_telegram_confirms_no_offset_while_the_writer_is_away():
    with telegram_stack() as s:
        s.start_gateway()
        with writer_paused(s):
            s.tg.message("while paused", user=TG_OWNER)
            time.sleep(PAUSE_S)  # the gateway has fetched it and waits for the writer
            assert 1 == len(s.tg.pending_updates())  # not confirmed: a crash now would get it again
        wait_until(lambda: not s.tg.pending_updates(), 20, what="the update confirmed after the writer's ack")
        assert ["while paused"] == user_turns(s, "tg", str(TG_OWNER))
        assert "echo: while paused" == s.replies(TG_OWNER, 1)[0]["text"]


def spooled_event_ids(s) -> list[str]:
    entries, _ = read_spool(s.home.paths.spool_dir / "gateway-slack.spool")
    return [e.event["payload"]["event_id"] for e in entries]


def test_slack_acks_an_envelope_only_once_it_is_spooled_while_the_writer_is_away():
    with slack_stack(ack_timeout=30) as s:
        s.start_gateway()
        with writer_paused(s):
            sent = time.monotonic()
            env = s.sl.message("D1", SLACK_OWNER, "while paused", channel_type="im")
            time.sleep(spool.DIRECT_S / 2)
            assert [] == s.sl.records("acks", envelope_id=env["envelope_id"])  # the writer gets its chance first
            wait_until(lambda: s.sl.records("acks", envelope_id=env["envelope_id"]), 10, what="the ack once spooled")
            assert time.monotonic() - sent >= spool.DIRECT_S * 0.9
            assert spooled_event_ids(s) == [env["payload"]["event_id"]]  # durable here before the ack went out
            assert [] == user_turns(s, "sl", "D1")
        wait_until(lambda: user_turns(s, "sl", "D1"), 20, what="the spooled event stored once the writer is back")
        assert ["while paused"] == user_turns(s, "sl", "D1")
        s.posted("D1", 1)
        wait_until(lambda: spooled_event_ids(s) == [], 10, what="the spool to drain")


def test_whatsapp_answers_no_200_while_the_writer_is_away():
    with whatsapp_stack() as s:
        s.start_gateway()
        body = json.dumps(message_payload(WA_OWNER, "while paused", phone_number_id=DEFAULT_PHONE_NUMBER_ID)).encode()
        status: list[int] = []
        with writer_paused(s):
            poster = threading.Thread(target=lambda: status.append(post_raw(s.webhook, body,
                                                                            sign(body, DEFAULT_APP_SECRET))))
            poster.start()
            time.sleep(PAUSE_S)
            assert [] == status  # the POST is held open: Meta gets no 200 for an uncommitted message
        poster.join(20)
        assert [200] == status and ["while paused"] == user_turns(s, "wa", WA_OWNER)
