"""Streamed answers end to end: a paced fake model, the real writer, runner and gateway, the fake Bot API and the
fake Slack. Drafts are seen while the model writes, then the answer arrives once; a gateway killed -9 mid-stream
still delivers it exactly once; an instance with streaming off shows no draft."""

from __future__ import annotations

import json
import time

import pytest

from tests.fake_telegram import DEFAULT_TOKEN
from tests.procs import wait_until
from tests.slack_stack import OWNER as SLACK_OWNER
from tests.slack_stack import SlackStack
from tests.telegram_stack import Stack

USER = 42
GROUP = -1005550000001
BOT = "fake123456789_bot"
SECOND_TOKEN = "987654321:AASecondFakeBotTokenForTests_987654"
PACE = {"tokens": 40, "seconds": 3}


@pytest.fixture(scope="module")
def tg():
    gateway = ('[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{TG}"\n'
               f'allow = [{USER}, 43, 44, {GROUP}]\nstreaming = "draft"\n'
               '[[gateways.telegram]]\nid = "quiet"\ntoken = "tg-token-2"\napi_base = "{TG}"\n'
               f'allow = [{USER}]\nstreaming = "off"\n')
    s = Stack(gateway=gateway, tokens=(DEFAULT_TOKEN, SECOND_TOKEN))
    try:
        s.fake_model.set_pace(PACE)
        s.start_gateway()
        yield s
    finally:
        s.stop()


def final_texts(sent: list[dict]) -> dict[int, str]:
    """Each message's text as it reads now (its last send or edit)."""
    texts: dict[int, str] = {}
    for record in sent:
        texts[record["message_id"]] = record["text"]
    return texts


def answer_of(text: str) -> str:
    words = f"echo: {text}".split()
    return " ".join(words + [f"tok{i}" for i in range(len(words), PACE["tokens"])])


def test_a_private_chat_sees_drafts_then_the_answer_once(tg):
    asked = time.time()
    tg.tg.message("stream to me", user=USER)
    [reply] = tg.replies(USER, 1, timeout=20)
    time.sleep(1.5)  # nothing more comes: no second answer, no draft after it
    drafts = tg.tg.drafts(chat_id=USER)
    assert answer_of("stream to me") == reply["text"] and 1 == len(tg.tg.sent(chat_id=USER))
    assert len(drafts) >= 2, drafts  # ~3 s of writing, at most one a second
    assert all(answer_of("stream to me").startswith(d["text"]) for d in drafts)
    assert drafts[0]["ts"] - asked < 1.5  # the first words show well before the answer
    assert all(b["ts"] - a["ts"] >= 0.95 for a, b in zip(drafts, drafts[1:]))
    assert all(d["ts"] < reply["ts"] for d in drafts)
    [row] = tg.settled("tg", USER)
    assert "sent" == row.state and 1 == row.attempts


def test_an_instance_with_streaming_off_sends_no_draft(tg):
    tg.tg.message("no drafts please", user=USER, bot=SECOND_TOKEN)
    wait_until(lambda: tg.tg.sent(chat_id=USER, bot=SECOND_TOKEN), 20, what="the quiet bot's answer")
    [reply] = tg.tg.sent(chat_id=USER, bot=SECOND_TOKEN)
    assert answer_of("no drafts please") == reply["text"]
    assert [] == tg.tg.drafts(bot=SECOND_TOKEN)
    assert [] == [r for r in tg.tg.requests(bot=SECOND_TOKEN) if r["method"] in ("editMessageText", "sendMessageDraft")]


def test_a_group_sees_one_placeholder_edited_into_the_answer(tg):
    asked = tg.tg.message(f"@{BOT} stream in the group", user={"id": 43, "is_bot": False, "first_name": "A"},
                          chat_id=GROUP)
    wait_until(lambda: tg.settled("tg", GROUP, timeout=20), 25, what="the group's answer delivered")
    time.sleep(1.2)
    sent = tg.tg.sent(chat_id=GROUP)
    kinds = [s["kind"] for s in sent]
    assert 1 == kinds.count("text") and kinds.count("edit") >= 2, kinds
    assert [answer_of("stream in the group")] == list(final_texts(sent).values())
    assert asked["message"]["message_id"] == sent[0]["reply_to"]  # the placeholder quotes the question, as the answer
    assert [] == tg.tg.drafts(chat_id=GROUP)


def test_a_gateway_killed_mid_stream_still_delivers_the_answer_exactly_once(tg):
    tg.tg.message(f"@{BOT} survive a crash", user={"id": 44, "is_bot": False, "first_name": "B"}, chat_id=GROUP)
    wait_until(lambda: any(s["text"].startswith("echo: survive") for s in tg.tg.sent(chat_id=GROUP)), 15,
               what="the placeholder of the streamed answer")
    kept = tg.home.paths.run_dir / "gateway-telegram.placeholders"
    wait_until(lambda: kept.exists() and str(GROUP) in kept.read_text(), 5,
               what="the placeholder noted for a successor")
    tg.kill_gateway()

    def answered():
        return [r for r in tg.outbox("tg", GROUP) if r.body.startswith("echo: survive") and r.state == "sent"]

    wait_until(answered, 25, what="the answer's row sent by the restarted gateway")
    [row] = answered()
    time.sleep(1.5)
    mine = [s for s in tg.tg.sent(chat_id=GROUP) if s["text"].startswith("echo: survive")]
    answer = answer_of("survive a crash")
    # the successor took the placeholder over from the file: one message, edited into the whole answer
    assert "sent" == row.state and {mine[0]["message_id"]: answer} == final_texts(mine), mine
    assert 1 == [s["kind"] for s in mine].count("text")
    retaken = [json.loads(x) for x in tg.gateway.log_text().splitlines() if "outbox_retaken" in x]
    assert [] == retaken  # the row was never in flight at the kill: no counted repeat either
    assert any("placeholders_taken_over" in x for x in tg.gateway.log_text().splitlines())


@pytest.fixture(scope="module")
def sl():
    s = SlackStack()
    try:
        s.fake_model.set_pace(PACE)
        s.start_gateway()
        yield s
    finally:
        s.stop()


def test_slack_updates_one_message_in_the_thread_then_it_is_the_answer(sl):
    sl.sl.add_channel("C300", member=True)
    mention = sl.sl.app_mention("C300", SLACK_OWNER, "stream in slack")
    thread = mention["payload"]["event"]["ts"]
    wait_until(lambda: sl.settled("sl", f"C300:{thread}", timeout=20), 25, what="the Slack answer delivered")
    time.sleep(1.2)
    posted = sl.sl.posted("C300")
    updates = sl.sl.updates("C300")
    assert 1 == len(posted) and thread == posted[0]["thread_ts"]
    assert len(updates) >= 2 and {posted[0]["ts"]} == {u["ts"] for u in updates}
    assert answer_of("stream in slack") == updates[-1]["text"]
    drafts = updates[:-1]  # the last is the answer, which waits for no draft pace
    assert all(b["time"] - a["time"] >= 0.9 for a, b in zip(drafts, drafts[1:]))
