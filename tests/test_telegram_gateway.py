"""The Telegram gateway against a fake Bot API, with the real writer, runner and gateway processes.

One stack for the module (long polling); each test uses chats of its own. Users 100..139 and the
group GROUP are allowed; everyone else is a stranger.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import db
from common.stores import access_store, outbox_store
from schema import messages as m
from tests.procs import REPO, wait_until
from tests.telegram_stack import Stack

ALLOWED = list(range(100, 140))
GROUP = -1001234567890
OTHER_GROUP = -1009999999999
BOT = "fake123456789_bot"
BOT_ID = 123456789
CAP_KB = 16


@pytest.fixture(scope="module")
def tg():
    gateway = (
        '[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{TG}"\n'
        f"allow = {ALLOWED + [GROUP]}\nmax_attachment_mb = {CAP_KB / 1024}\n"
    )
    s = Stack(gateway=gateway)
    try:
        s.start_gateway()
        yield s
    finally:
        s.stop()


def user(uid: int) -> dict:
    return {"id": uid, "is_bot": False, "first_name": f"U{uid}", "username": f"u{uid}"}


def user_turns(s, chat: int) -> list[str]:
    return s.user_turns("tg", chat)


def outbox(s, chat: int) -> list[outbox_store.Row]:
    return s.outbox("tg", chat)


def call(s, op, key=None):
    async def go():
        async with s.home.client("test") as c:
            return await c.call(op, key=key)
    return asyncio.run(go())


def model_saw(s, text: str) -> bool:
    return s.model_saw(text)


def settled(s, chat: int, timeout: float = 10.0) -> list[outbox_store.Row]:
    return s.settled("tg", chat, timeout)


# ---------------------------------------------------------------- the basics


def test_a_message_gets_its_reply_as_formatted_text(tg):
    tg.tg.message("hello **there**", user=100)
    [reply] = tg.replies(100, 1)
    assert ("echo: hello <b>there</b>", "HTML") == (reply["text"], reply["parse_mode"])
    [row] = settled(tg, 100)
    assert ("sent", str(reply["message_id"])) == (row.state, row.platform_msg_id)
    assert ["hello **there**"] == user_turns(tg, 100)


def test_typing_shows_while_the_agent_works_and_not_for_quick_answers(tg):
    tg.tg.message("quick", user=116)
    tg.replies(116, 1)
    tg.fake_model.add({"delay": 6.0, "text": "slow answer"})
    tg.tg.message("slow", user=117)
    assert "slow answer" == tg.replies(117, 1, timeout=30)[0]["text"]
    actions = [a["ts"] for a in tg.tg.actions(chat_id=117) if a.get("action") == "typing"]
    assert 2 <= len(actions) <= 3  # after 1 s, then every 4 s while the turn runs
    time.sleep(1.0)
    assert [] == tg.tg.actions(chat_id=116)


def test_a_redelivered_message_is_never_a_second_turn(tg):
    update = tg.tg.message("only once", user=101)
    tg.tg.inject({"message": update["message"]})  # the same message under a new update id
    tg.replies(101, 1)
    wait_until(lambda: not tg.tg.pending_updates(), 10, what="both updates confirmed")
    time.sleep(0.5)
    assert (["only once"], 1) == (user_turns(tg, 101), len(tg.tg.sent(chat_id=101)))


def test_an_edited_message_is_a_new_turn_marked_edited(tg):
    update = tg.tg.message("first words", user=102)
    tg.replies(102, 1)
    tg.tg.edited_message(update["message"]["message_id"], "better words", user=102)
    tg.replies(102, 2)
    assert ["first words", "[edited] better words"] == user_turns(tg, 102)


def test_a_reply_carries_what_it_answers(tg):
    first = tg.tg.message("the original", user=103)
    tg.replies(103, 1)
    tg.tg.message("and this", user=103, reply_to=first["message"]["message_id"])
    tg.replies(103, 2)
    assert "[in reply to: the original]\nand this" == user_turns(tg, 103)[-1]


def test_a_long_answer_is_split_in_order_without_breaking_code(tg):
    text = "intro\n```\n" + "\n".join(f"line {i} <&>" for i in range(900)) + "\n```\n" + "end " * 300
    tg.tg.message(text, user=104)
    rows = settled(tg, 104, timeout=30)
    parts = tg.tg.sent(chat_id=104)
    assert len(parts) >= 3 and all(p["parse_mode"] == "HTML" for p in parts)
    assert "sent" == rows[-1].state
    # each part is balanced HTML the fake accepted; the code block is reopened in every part it spans
    assert all(p["text"].count("<pre>") == p["text"].count("</pre>") for p in parts)
    joined = "".join(p["text"] for p in parts)
    assert "line 0 &lt;&amp;&gt;" in joined and "line 899 &lt;&amp;&gt;" in joined
    assert joined.index("line 0 ") < joined.index("line 899") < joined.rindex("end")


def test_commands_reach_the_agent_and_start_is_answered_by_the_gateway(tg):
    tg.tg.message("/start", user=105)
    [welcome] = tg.replies(105, 1)
    assert "/help" in welcome["text"] and [] == user_turns(tg, 105)
    tg.tg.message(f"/help@{BOT}", user=105)
    replies = tg.replies(105, 2)
    assert "/new" in replies[-1]["text"] and ["/help"] == user_turns(tg, 105)


# ---------------------------------------------------------------- access


def test_a_stranger_gets_a_pairing_code_and_never_reaches_the_model(tg):
    stranger = 900
    tg.tg.message("secret plans 123", user=stranger)
    [notice] = tg.replies(stranger, 1)
    code = notice["text"].split("pairing code is ")[1][:8]
    tg.tg.message("more secret plans 456", user=stranger)
    wait_until(lambda: not tg.tg.pending_updates(), 10, what="the second update confirmed")
    time.sleep(0.5)
    assert 1 == len(tg.tg.sent(chat_id=stranger))  # the reminder is rate limited
    assert not model_saw(tg, "secret plans") and [] == user_turns(tg, stranger)
    listed = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(tg.home.root), "pairing", "list"],
                            cwd=REPO, capture_output=True, text=True, timeout=30)
    assert code in listed.stdout
    approved = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(tg.home.root), "pairing", "approve",
                               code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert 0 == approved.returncode, approved.stderr
    tg.tg.message("hello now", user=stranger)
    assert "echo: hello now" == tg.replies(stranger, 2)[-1]["text"]
    assert ["hello now"] == user_turns(tg, stranger)


def test_start_from_a_stranger_gives_the_code(tg):
    tg.tg.message("/start", user=901)
    [notice] = tg.replies(901, 1)
    assert "starling pairing approve" in notice["text"]


def test_a_group_is_answered_only_when_allowed_and_addressed(tg):
    tg.tg.message("not for the bot", user=user(106), chat_id=GROUP, title="team")
    asked = tg.tg.message(f"@{BOT} what time is it", user=user(106), chat_id=GROUP)
    replies = tg.replies(GROUP, 1)
    bot_msg = replies[0]["message_id"]
    assert asked["message"]["message_id"] == replies[0]["reply_to"]  # in a group, the answer quotes the question
    tg.tg.message("and a reply to the bot", user=user(107), chat_id=GROUP, reply_to=bot_msg)
    tg.tg.message("/status@someotherbot", user=user(106), chat_id=GROUP)
    tg.tg.message("words in a group nobody allowed", user=user(106), chat_id=OTHER_GROUP)
    tg.tg.message(f"@{BOT} hello?", user=user(106), chat_id=OTHER_GROUP)
    tg.replies(GROUP, 2)
    wait_until(lambda: not tg.tg.pending_updates(), 10, what="all updates confirmed")
    time.sleep(0.5)
    assert ["what time is it", "[in reply to: echo: what time is it]\nand a reply to the bot"] == user_turns(tg, GROUP)
    assert ([], []) == (user_turns(tg, OTHER_GROUP), tg.tg.sent(chat_id=OTHER_GROUP))  # no codes in public
    assert not model_saw(tg, "not for the bot")


def test_each_topic_of_a_forum_group_is_a_conversation_answered_in_its_topic(tg):
    for topic, text in ((77, "in topic 77"), (88, "in topic 88")):
        tg.tg.message(f"@{BOT} {text}", user=user(108), chat_id=GROUP,
                      extra={"message_thread_id": topic, "is_topic_message": True})
    wait_until(lambda: 2 <= len([s for s in tg.tg.sent(chat_id=GROUP) if "in topic" in (s["text"] or "")]), 20,
               what="both topic answers")
    sends = {r["params"].get("text"): r["params"].get("message_thread_id") for r in tg.tg.requests("sendMessage")
             if r["params"].get("chat_id") == GROUP}
    assert (77, 88) == (sends["echo: in topic 77"], sends["echo: in topic 88"])
    assert (["in topic 77"], ["in topic 88"]) == (user_turns(tg, f"{GROUP}:77"), user_turns(tg, f"{GROUP}:88"))


# ---------------------------------------------------------------- files


def test_a_photo_is_saved_privately_and_described_to_the_agent(tg):
    content = os.urandom(3000)
    tg.tg.photo(content, caption="look at this", user=108)
    tg.replies(108, 1)
    [text] = user_turns(tg, 108)
    assert text.startswith("look at this\n[photo attached: ")
    saved = Path(text.split("[photo attached: ")[1].split(" (")[0])
    day = time.strftime("%Y-%m-%d", time.gmtime())
    assert saved.parent == tg.home.paths.attachments_dir / "default" / day
    assert content == saved.read_bytes()
    assert 0o600 == stat.S_IMODE(saved.stat().st_mode)


def test_same_named_files_from_two_chats_never_share_a_path(tg):
    first, second = os.urandom(1500), os.urandom(1700)
    tg.tg.document(first, file_name="scan.pdf", user=118)   # each chat's first message: message id 1 in both
    tg.tg.document(second, file_name="scan.pdf", user=119)
    tg.replies(118, 1)
    tg.replies(119, 1)
    paths = [Path(user_turns(tg, chat)[0].split("[document attached: ")[1].split(" (")[0]) for chat in (118, 119)]
    assert paths[0] != paths[1]
    assert (first, second) == (paths[0].read_bytes(), paths[1].read_bytes())


def test_a_mention_of_a_lookalike_bot_is_not_a_mention(tg):
    tg.tg.message(f"@{BOT}_fan what do you think", user=user(106), chat_id=GROUP)
    tg.tg.message(f"@{BOT} and you?", user=user(106), chat_id=GROUP)
    wait_until(lambda: any("and you?" in (r["text"] or "") for r in tg.tg.sent(chat_id=GROUP)), 20,
               what="the real mention answered")
    assert not model_saw(tg, "what do you think")


def test_a_file_over_the_cap_is_not_fetched_and_the_agent_is_told(tg):
    tg.tg.document(os.urandom((CAP_KB + 4) * 1024), file_name="big.bin", user=109)
    tg.tg.voice(os.urandom(2000), user=109)
    tg.replies(109, 2)
    first, second = user_turns(tg, 109)
    assert "[document not saved: 20.0 KB" not in first  # sizes are in MB
    assert first.startswith("[document not saved: ") and "limit" in first
    assert second.startswith("[voice attached: ")
    assert not any("big.bin" in p.name for p in tg.home.paths.attachments_dir.rglob("*"))


def test_a_file_from_the_agent_goes_as_photo_or_document(tg):
    chat = 110
    picture = tg.home.paths.shared_workspace / "chart.png"
    picture.write_bytes(b"\x89PNG" + os.urandom(500))
    report = tg.home.paths.shared_workspace / "report.pdf"
    report.write_bytes(os.urandom(800))
    call(tg, m.EnqueueOutbox(instance="tg", chat=str(chat), replies=[
        m.Reply(text="the **chart**", file_path=str(picture)), m.Reply(file_path=str(report)),
        m.Reply(file_path=str(tg.home.paths.shared_workspace / "missing.txt"))]))
    rows = settled(tg, chat)
    sent = tg.tg.sent(chat_id=chat)
    assert [("photo", "the <b>chart</b>"), ("document", None)] == [(s["kind"], s["text"]) for s in sent]
    assert ["sent", "sent", "failed"] == [r.state for r in rows]
    assert "file not found" in rows[2].error


# ---------------------------------------------------------------- the Bot API's errors


def test_a_flood_wait_holds_up_only_its_own_chat(tg):
    slow, fast = 111, 112
    tg.tg.script_error("sendMessage", "flood", chat_id=slow, retry_after=2)
    t0 = time.time()
    tg.tg.message("slow one", user=slow)
    tg.tg.message("fast one", user=fast)
    [f] = tg.replies(fast, 1)
    [s] = tg.replies(slow, 1)
    assert f["ts"] - t0 < 1.5 and s["ts"] - t0 >= 2.0
    [row] = settled(tg, slow)
    assert 2 == row.attempts


def test_blocked_by_the_user_fails_and_is_not_retried(tg):
    chat = 113
    tg.tg.block(chat)
    tg.tg.message("anyone there", user=chat)
    [row] = settled(tg, chat)
    assert ("failed", 1) == (row.state, row.attempts) and "blocked" in row.error
    time.sleep(1.5)
    tries = [r for r in tg.tg.requests("sendMessage") if str(r["params"].get("chat_id")) == str(chat)]
    assert 1 == len(tries)


def test_rejected_entities_fall_back_to_plain_text(tg):
    chat = 114
    tg.tg.script_error("sendMessage", "parse", chat_id=chat)
    tg.tg.message("some **bold** words", user=chat)
    [reply] = tg.replies(chat, 1)
    assert ("echo: some bold words", None) == (reply["text"], reply["parse_mode"])


def test_a_group_that_became_a_supergroup_is_followed(tg):
    old, new = -4000001, -1004000001
    tg.tg.migrate(old, new)
    call(tg, m.EnqueueOutbox(instance="tg", chat=str(old), replies=[m.Reply(text="to the old id")]))
    call(tg, m.EnqueueOutbox(instance="tg", chat=str(old), replies=[m.Reply(text="and the next")]))
    rows = settled(tg, old)
    assert ["sent", "sent"] == [r.state for r in rows]
    assert ["to the old id", "and the next"] == [s["text"] for s in tg.tg.sent(chat_id=new)]
    # the second went straight to the new id
    assert 3 == len([r for r in tg.tg.requests("sendMessage") if r["params"].get("chat_id") in (old, new)])


def test_garbage_and_unknown_updates_are_skipped_without_stalling(tg):
    tg.tg.inject({"message": "not a message"})
    tg.tg.inject({"poll": {"id": "1", "question": "?"}})
    tg.tg.inject({"message": {"message_id": 1, "chat": {"id": 115, "type": "private"}}})  # no sender
    tg.tg.message("x" * 100_000, user=115)  # far over Telegram's own limit: cut, not fatal
    tg.tg.message("still here", user=115)
    wait_until(lambda: "echo: still here" in [r["text"] for r in tg.tg.sent(chat_id=115)], 20,
               what="the answer after the garbage")
    turns = user_turns(tg, 115)
    assert 32_000 < len(turns[0]) < 32_100 and turns[0].endswith("[message cut: too long]")
    assert tg.gateway.alive()
    assert "update_skipped" in tg.gateway.log_text()


def test_the_pairing_code_is_stored_for_the_instance(tg):
    tg.tg.message("hi", user=902)
    tg.replies(902, 1)
    conn = tg.reader()
    with db.read_tx(conn):
        codes = [c for c in access_store.pending(conn, time.time()) if c.sender == "902"]
    assert 1 == len(codes) and ("tg", "902") == (codes[0].instance, codes[0].chat)
