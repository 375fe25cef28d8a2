"""The Slack gateway over Socket Mode against the fake Slack, with the real writer, runner and gateway.

One stack for the module; each test uses channels of its own. OWNER and the users U100..U139 are
allowed; everyone else is a stranger.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from common import db
from common.stores import outbox_store, turn_store
from schema import messages as m
from tests.procs import wait_until
from tests.slack_stack import OWNER, SlackStack
from tests.test_telegram_gateway import call

ALLOWED = [OWNER] + [f"U{i}" for i in range(100, 140)]
CAP_KB = 16


@pytest.fixture(scope="module")
def sl():
    gateway = ('[[gateways.slack]]\nid = "sl"\napi_base = "{API}"\nping_interval_s = 1\n'
               f"allow = {json.dumps(ALLOWED)}\nmax_attachment_mb = {CAP_KB / 1024}\n")
    s = SlackStack(gateway=gateway)
    try:
        s.start_gateway()
        yield s
    finally:
        s.stop()


def user_turns(s, chat: str) -> list[str]:
    return s.user_turns("sl", chat)


def outbox(s, chat: str) -> list[outbox_store.Row]:
    return s.outbox("sl", chat)


def settled(s, chat: str, timeout: float = 10.0) -> list[outbox_store.Row]:
    return s.settled("sl", chat, timeout)


def model_saw(s, text: str) -> bool:
    return s.model_saw(text)


def test_a_direct_message_is_answered_in_the_dm_and_acked_after_the_writer(sl):
    env = sl.sl.message("D100", "U100", "hello **there**", channel_type="im")
    [reply] = sl.posted("D100", 1)
    assert ("echo: hello *there*", None) == (reply["text"], reply["thread_ts"])
    [ack] = sl.sl.records("acks", envelope_id=env["envelope_id"])
    conn = sl.reader()
    with db.read_tx(conn):
        [turn] = turn_store.user_turns_for_chat(conn, "sl", "D100")
    assert turn.created_at <= ack["time"]  # stored (committed) before Slack was told
    [row] = settled(sl, "D100")
    assert ("sent", reply["ts"]) == (row.state, row.platform_msg_id)


def test_a_mention_is_answered_in_its_thread_and_the_thread_goes_on_without_mentions(sl):
    sl.sl.add_channel("C200", member=True)
    mention = sl.sl.app_mention("C200", "U101", "what is up")
    ts = mention["payload"]["event"]["ts"]
    [reply] = sl.posted("C200", 1)
    assert ("echo: what is up", ts) == (reply["text"], reply["thread_ts"])
    sl.sl.message("C200", "U101", "and more", thread_ts=ts, channel_type="channel")
    sl.posted("C200", 2)
    sl.sl.message("C200", "U101", "chatter without the bot", channel_type="channel")
    time.sleep(1.0)
    assert ["what is up", "and more"] == user_turns(sl, f"C200:{ts}")
    assert not model_saw(sl, "chatter without the bot")


def test_a_reply_right_behind_the_mention_that_starts_its_thread_is_answered(sl):
    sl.sl.add_channel("C203", member=True)
    for i in range(5):  # no wait between the mention and the reply: the reply waits for the mention's turn
        mention = sl.sl.app_mention("C203", "U105", f"start {i}")
        ts = mention["payload"]["event"]["ts"]
        sl.sl.message("C203", "U105", f"right behind {i}", thread_ts=ts, channel_type="channel")
    # each thread's reply is answered: with its mention's turn (queue = "collect", the default, when it came
    # before that turn's model call) or by a turn of its own; the echo model names the newest message it saw
    want = {f"echo: right behind {i}" for i in range(5)}
    posted = lambda: {r["text"] for r in sl.sl.records("posted", channel="C203")}  # noqa: E731
    wait_until(lambda: want <= posted(), timeout=20, what="every reply answered")
    time.sleep(0.5)
    assert 5 <= len(sl.sl.records("posted", channel="C203")) <= 10


def test_the_same_message_as_mention_and_message_event_is_one_turn(sl):
    sl.sl.add_channel("C201", member=True)
    ts = "1700000000.000201"
    sl.sl.app_mention("C201", "U102", f"<@{sl.sl.bot_user_id}> once please", ts=ts)
    sl.sl.message("C201", "U102", f"<@{sl.sl.bot_user_id}> once please", ts=ts, channel_type="channel")
    sl.posted("C201", 1)
    time.sleep(1.0)
    assert (["once please"], 1) == (user_turns(sl, f"C201:{ts}"), len(sl.sl.records("posted", channel="C201")))


def test_bot_messages_are_ignored(sl):
    sl.sl.message("D103", "U103", "from a bot", channel_type="im", bot_id="B0OTHER")
    sl.sl.message("D103", sl.sl.bot_user_id, "from myself", channel_type="im")
    sl.sl.message("D103", "U103", "from a person", channel_type="im")
    sl.posted("D103", 1)
    assert ["from a person"] == user_turns(sl, "D103")


def test_a_stranger_gets_a_pairing_code_and_never_reaches_the_model(sl):
    sl.sl.message("D900", "U900", "stranger secrets", channel_type="im")
    [notice] = sl.posted("D900", 1)
    assert "starling pairing approve" in notice["text"]
    sl.sl.add_channel("C900", member=True)
    sl.sl.app_mention("C900", "U901", "stranger in a channel")
    time.sleep(1.0)
    assert not model_saw(sl, "stranger") and [] == sl.sl.records("posted", channel="C900")


def test_an_approval_button_is_the_approve_command_in_its_conversation(sl):
    sl.sl.add_channel("C202", member=True)
    mention = sl.sl.app_mention("C202", "U104", "start")
    ts = mention["payload"]["event"]["ts"]
    sl.posted("C202", 1)
    sl.sl.block_actions("C202", "U104", "starling_approve", "AB12CD34", message_ts=ts, thread_ts=ts)
    replies = sl.posted("C202", 2)
    assert "/approve AB12CD34" == user_turns(sl, f"C202:{ts}")[-1]
    assert "no approval AB12CD34" in replies[-1]["text"]


def test_an_approval_notice_gets_buttons(sl):
    sl.sl.add_channel("D105", type="im")
    call(sl, m.EnqueueOutbox(instance="sl", chat="D105", replies=[m.Reply(
        text="I need your approval to run a command:\nrm -rf /tmp/x\nApprove with /approve XY34ZW56 or /deny XY34ZW56.",
        approval_id="XY34ZW56")]))
    [post] = sl.posted("D105", 1)
    actions = next(b for b in post["blocks"] if b["type"] == "actions")
    assert [("starling_approve", "XY34ZW56"), ("starling_deny", "XY34ZW56")] == [
        (e["action_id"], e["value"]) for e in actions["elements"]]
    # the buttons come from the reply's approval id, never from its prose
    call(sl, m.EnqueueOutbox(instance="sl", chat="D105", replies=[m.Reply(text="Type /approve AB12CD34 to go on.")]))
    _, quoted = sl.posted("D105", 2)
    assert "Type /approve AB12CD34 to go on." == quoted["text"] and not quoted.get("blocks")


def test_a_shared_file_is_fetched_with_the_bot_token(sl):
    content = os.urandom(2000)
    shared = sl.sl.add_file(content, name="notes.bin", mimetype="application/octet-stream")
    big = sl.sl.add_file(os.urandom((CAP_KB + 4) * 1024), name="big.bin", mimetype="application/octet-stream")
    sl.sl.message("D106", "U106", "two files", channel_type="im", files=[shared, big])
    sl.posted("D106", 1)
    [text] = user_turns(sl, "D106")
    assert "[file attached: " in text and "[file not saved: " in text
    saved = Path(text.split("[file attached: ")[1].split(" (")[0])
    assert content == saved.read_bytes() and 0o600 == stat.S_IMODE(saved.stat().st_mode)


def test_two_files_of_one_name_in_one_message_keep_their_own_bytes(sl):
    one, two = os.urandom(900), os.urandom(1100)
    files = [sl.sl.add_file(one, name="image.png", mimetype="image/png"),
             sl.sl.add_file(two, name="image.png", mimetype="image/png")]
    sl.sl.message("D112", "U112", "two screenshots", channel_type="im", files=files)
    sl.posted("D112", 1)
    [text] = user_turns(sl, "D112")
    paths = [Path(part.split(" (")[0]) for part in text.split("[image attached: ")[1:]]
    assert 2 == len(paths), text
    assert 2 == len(set(paths)) and [one, two] == [p.read_bytes() for p in paths]
    assert all(p.parent.parent.parent == sl.home.paths.attachments_dir for p in paths)


def test_a_file_from_the_agent_goes_by_the_external_upload_flow(sl):
    report = sl.home.paths.shared_workspace / "report.csv"
    report.write_bytes(b"a,b\n1,2\n")
    sl.sl.add_channel("C207", member=True)
    call(sl, m.EnqueueOutbox(instance="sl", chat="C207:1700000000.000207", replies=[
        m.Reply(text="the **report**", file_path=str(report))]))
    [row] = settled(sl, "C207:1700000000.000207")
    [upload] = sl.sl.uploads()[-1:]
    assert ("sent", "report.csv", "C207", "1700000000.000207") == (
        row.state, upload["name"], upload["channel"], upload["thread_ts"])
    assert b"a,b\n1,2\n" == sl.sl.upload_content(row.platform_msg_id)


def test_a_rate_limited_channel_waits_alone_and_a_missing_channel_fails_for_good(sl):
    sl.sl.script_error("chat.postMessage", "ratelimited", channel="D107", retry_after=2)
    t0 = time.time()
    sl.sl.message("D107", "U107", "slow", channel_type="im")
    sl.sl.message("D108", "U108", "fast", channel_type="im")
    [fast] = sl.posted("D108", 1)
    [slow] = sl.posted("D107", 1)
    assert fast["time"] - t0 < 1.5 and slow["time"] - t0 >= 2.0
    call(sl, m.EnqueueOutbox(instance="sl", chat="C0GONE", replies=[m.Reply(text="into the void")]))
    [row] = settled(sl, "C0GONE")
    assert ("failed", 1) == (row.state, row.attempts) and "channel_not_found" in row.error


def test_a_working_reaction_while_the_agent_thinks(sl):
    sl.fake_model.add({"delay": 3.0, "text": "thought about it"})
    env = sl.sl.message("D109", "U109", "think", channel_type="im")
    sl.posted("D109", 1, timeout=20)
    ts = env["payload"]["event"]["ts"]
    wait_until(lambda: 2 <= len([r for r in sl.sl.reactions() if r["ts"] == ts]), 10, what="added and removed")
    assert [("add", "eyes"), ("remove", "eyes")] == [(r["action"], r["name"]) for r in sl.sl.reactions()
                                                     if r["ts"] == ts]


def test_disconnects_and_a_silent_socket_are_survived(sl):
    sl.sl.disconnect("refresh_requested")
    sl.sl.message("D110", "U110", "after refresh", channel_type="im")
    sl.posted("D110", 1)
    sl.sl.silence()
    sl.sl.message("D110", "U110", "after silence", channel_type="im")
    assert "echo: after silence" == sl.posted("D110", 2, timeout=30)[-1]["text"]
    assert "socket_closed" in sl.gateway.log_text() or "socket_failed" in sl.gateway.log_text()


def test_garbage_envelopes_are_skipped(sl):
    sl.sl.inject({"type": "event_callback", "event_id": "EvBAD1", "event": "not an event"})
    sl.sl.inject({"type": "event_callback", "event_id": "EvBAD2", "event": {"type": "reaction_added"}})
    sl.sl.send_raw("{not json")
    sl.sl.message("D111", "U111", "still fine", channel_type="im")
    assert "echo: still fine" == sl.posted("D111", 1)[0]["text"]
    assert sl.gateway.alive() and "event_skipped" in sl.gateway.log_text()


def test_the_heartbeat_shows_the_socket_state(sl):
    from common.stores import beat_store

    def detail() -> str:
        conn = sl.reader()
        with db.read_tx(conn):
            return next((b.detail for b in beat_store.all_beats(conn) if b.service == "gateway-slack"), "")

    wait_until(lambda: "sl: socket: connected as U0BOT001" in detail(), 10, what="the connected state in a beat")
