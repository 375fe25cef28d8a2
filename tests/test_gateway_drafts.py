"""Streamed drafts in the gateway (services/gateway/drafts.py) with the kit's send_row (delivery.py), against the
in-process fake Bot API and fake Slack: what a chat sees while an answer is written, then the answer once."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import aiohttp

from schema import messages as m
from services.gateway import drafts as drafts_mod
from services.gateway.channel import Sent
from services.gateway.delivery import send_row
from services.gateway.drafts import Drafts
from services.gateway.slack.api import SlackApi
from services.gateway.slack.outbound import Sender as SlackSender
from services.gateway.telegram.api import BotApi
from services.gateway.telegram.outbound import Sender as TelegramSender
from tests.fake_slack import FakeSlack
from tests.fake_telegram import MAX_TEXT, FakeTelegram, utf16_len

USER = 42
GROUP = -100777


class _Log:
    def bind(self, **_kw):
        return self

    def __getattr__(self, name):
        return lambda *a, **k: None


def _gateway(sender, instance: str = "tg", run_dir: Path | None = None) -> SimpleNamespace:
    """What Drafts reads of a Gateway: its log, channels (each gives its Outbound by ``outbound()``), the config's
    streams(), the typing sign's current message, and where its placeholders file goes."""
    return SimpleNamespace(log=_Log(), channels={instance: SimpleNamespace(outbound=lambda: sender)},
                           svc=SimpleNamespace(name="gateway-test", cfg=SimpleNamespace(
                               gateways=SimpleNamespace(streams=lambda i: True))),
                           paths=SimpleNamespace(run_dir=run_dir or Path(tempfile.mkdtemp(prefix="drafts-"))),
                           typing=SimpleNamespace(replying_to=lambda i, c: ""))


def _draft(chat, text: str, turn: int = 7, step: int = 0, seq: int = 1, instance: str = "tg",
           done: bool = False) -> m.AnswerDraft:
    return m.AnswerDraft(epoch="e", seq=seq, instance=instance, chat=str(chat), session_id=3, turn_id=turn, step=step,
                         text=text, done=done)


def _row(chat, body: str, turn: int = 7, instance: str = "tg", **kw) -> m.OutboxItem:
    return m.OutboxItem(id=kw.pop("id", 1), instance=instance, chat=str(chat), kind="text", body=body, file_path="",
                        reply_to="", attempt=kw.pop("attempt_", 1), session_id=3, turn_id=turn, **kw)


async def _nothing(_n: int, _id: str) -> None:
    return None


async def _stream(drafts: Drafts, chat, words: int, every_s: float, **kw) -> str:
    """The runner's drafts of one answer: the whole text so far every ``every_s``."""
    text = ""
    for i in range(words):
        text += f"word{i} "
        drafts.show(_draft(chat, text, seq=i + 1, **kw))
        await asyncio.sleep(every_s)
    return text.strip()


def test_private_chat_sees_paced_previews_then_the_answer_once():
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            drafts = Drafts(_gateway(sender))
            started = time.monotonic()
            answer = await _stream(drafts, USER, 30, 0.1)  # 3 s of drafts, ten a second
            placeholder = await drafts.take(_row(USER, answer))
            outcome = await send_row(sender, _row(USER, answer), _nothing, placeholder)
            drafts.show(_draft(USER, answer + " late"))  # a hint after the answer: not shown
            await asyncio.sleep(1.2)
            return tg.drafts(chat_id=USER), tg.sent(chat_id=USER), placeholder, outcome, started

    shown, sent, placeholder, outcome, started = asyncio.run(go())
    assert isinstance(outcome, Sent) and "" == placeholder  # a preview is never a message to edit
    assert [("text", "word0 word1 word2 word3 word4 word5 word6 word7 word8 word9 word10 word11 word12 word13 "
             "word14 word15 word16 word17 word18 word19 word20 word21 word22 word23 word24 word25 word26 word27 "
             "word28 word29")] == [(s["kind"], s["text"]) for s in sent]
    assert 2 <= len(shown) <= 4, shown  # 3 s of drafts, the first after 0.5 s, then at most one a second
    assert all(b["ts"] - a["ts"] >= 0.95 for a, b in zip(shown, shown[1:]))
    assert shown[0]["ts"] - started >= drafts_mod.FIRST_AFTER_S - 0.05
    assert {8} == {d["draft_id"] for d in shown}  # one draft id per turn: Telegram animates its changes
    assert all(d["ts"] < sent[0]["ts"] for d in shown)  # no preview after the answer
    assert all(len(a["text"]) < len(b["text"]) for a, b in zip(shown, shown[1:]))


def test_group_placeholder_is_edited_then_becomes_the_answer():
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            drafts = Drafts(_gateway(sender))
            answer = await _stream(drafts, GROUP, 25, 0.1)
            await asyncio.sleep(0.3)
            row = _row(GROUP, answer + "\n\nand **done**.")
            placeholder = await drafts.take(row)
            outcome = await send_row(sender, row, _nothing, placeholder)
            return tg.sent(chat_id=GROUP), tg.drafts(), placeholder, outcome

    sent, previews, placeholder, outcome = asyncio.run(go())
    assert [] == previews  # sendMessageDraft is for private chats only
    kinds = [s["kind"] for s in sent]
    assert "text" == kinds[0] and kinds.count("text") == 1 and set(kinds[1:]) == {"edit"} and len(kinds) >= 3
    assert {str(sent[0]["message_id"])} == {str(s["message_id"]) for s in sent} == {placeholder}
    assert outcome == Sent(placeholder)
    assert sent[-1]["text"].endswith("and <b>done</b>.") and "HTML" == sent[-1]["parse_mode"]


def test_a_long_draft_shows_its_tail_within_the_limit():
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            drafts = Drafts(_gateway(sender))
            long = " ".join(f"w{i}" for i in range(3000)) + " THE-END"  # ~17,000 characters
            drafts.show(_draft(USER, long))
            drafts.show(_draft(GROUP, long))
            await asyncio.sleep(drafts_mod.FIRST_AFTER_S + 0.6)
            return tg.drafts(chat_id=USER), tg.sent(chat_id=GROUP), [r for r in tg.requests() if r.get("status") != 200]

    shown, placeholder, errors = asyncio.run(go())
    assert [] == errors
    for text in (shown[-1]["text"], placeholder[-1]["text"]):
        assert text.endswith("THE-END") and utf16_len(text) <= MAX_TEXT and not text.startswith("w0 ")


def test_a_draft_refused_stops_the_drafts_and_the_answer_still_comes_once():
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            tg.script_error("sendMessageDraft", "chat_not_found", times=100)
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            drafts = Drafts(_gateway(sender))
            answer = await _stream(drafts, USER, 25, 0.1)
            row = _row(USER, answer)
            outcome = await send_row(sender, row, _nothing, await drafts.take(row))
            return tg.requests("sendMessageDraft"), tg.sent(chat_id=USER), outcome, drafts.failed

    tried, sent, outcome, failed = asyncio.run(go())
    assert 1 == len(tried) == failed  # refused once: this answer's drafts stop, no retry storm
    assert isinstance(outcome, Sent) and 1 == len(sent) and sent[0]["text"].startswith("word0 ")


def test_a_flood_wait_on_a_draft_is_waited_out_and_the_answer_edits_the_placeholder():
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            drafts = Drafts(_gateway(sender))
            drafts.show(_draft(GROUP, "first words"))
            await asyncio.sleep(drafts_mod.FIRST_AFTER_S + 0.3)
            tg.script_error("editMessageText", "flood", times=1, retry_after=1)
            answer = await _stream(drafts, GROUP, 20, 0.1)
            row = _row(GROUP, answer)
            outcome = await send_row(sender, row, _nothing, await drafts.take(row))
            return tg.sent(chat_id=GROUP), tg.requests("editMessageText"), outcome

    sent, edits, outcome = asyncio.run(go())
    assert 429 in [e.get("status") for e in edits]
    assert 1 == [s["kind"] for s in sent].count("text") and sent[-1]["text"] == "word0 " + " ".join(
        f"word{i}" for i in range(1, 20)) and isinstance(outcome, Sent)


def test_an_answer_of_another_turn_leaves_the_drafts_alone():
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            drafts = Drafts(_gateway(sender))
            drafts.show(_draft(GROUP, "turn eight writes", turn=8))
            await asyncio.sleep(drafts_mod.FIRST_AFTER_S + 0.3)
            earlier = _row(GROUP, "the answer of turn seven", turn=7)
            took = await drafts.take(earlier)
            await send_row(sender, earlier, _nothing, took)
            mine = _row(GROUP, "turn eight's answer", turn=8, id=2)
            took8 = await drafts.take(mine)
            await send_row(sender, mine, _nothing, took8)
            return took, took8, tg.sent(chat_id=GROUP)

    took, took8, sent = asyncio.run(go())
    assert "" == took and took8
    assert [("text", "turn eight writes"), ("text", "the answer of turn seven"), ("edit", "turn eight's answer")] == [
        (s["kind"], s["text"]) for s in sent]


def test_a_placeholder_deleted_meanwhile_means_the_answer_is_sent_anew():
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            drafts = Drafts(_gateway(sender))
            drafts.show(_draft(GROUP, "a draft"))
            await asyncio.sleep(drafts_mod.FIRST_AFTER_S + 0.3)
            row = _row(GROUP, "the answer")
            placeholder = await drafts.take(row)
            tg.script_error("editMessageText", "chat_not_found", times=1, description="Bad Request: message to edit"
                            " not found")
            outcome = await send_row(sender, row, _nothing, placeholder)
            return tg.sent(chat_id=GROUP), tg.deleted(), outcome, placeholder

    sent, deleted, outcome, placeholder = asyncio.run(go())
    assert [("text", "a draft"), ("text", "the answer")] == [(s["kind"], s["text"]) for s in sent]
    assert [int(placeholder)] == [d["message_id"] for d in deleted]  # the stale placeholder goes
    assert outcome == Sent(str(sent[1]["message_id"]))


def test_a_successor_after_a_crash_edits_its_predecessors_placeholder(tmp_path):
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            dead = Drafts(_gateway(sender, run_dir=tmp_path))
            dead.show(_draft(GROUP, "the first words"))
            await asyncio.sleep(drafts_mod.FIRST_AFTER_S + 0.3)
            dead.close()  # as if killed: nothing more from it
            successor = Drafts(_gateway(TelegramSender(BotApi(tg.url, tg.token, session), _Log()), run_dir=tmp_path))
            successor.show(_draft(GROUP, "the first words and more", seq=2))
            await asyncio.sleep(1.2)
            row = _row(GROUP, "the first words and more, all of them")
            out = successor.gateway.channels["tg"].outbound()
            outcome = await send_row(out, row, _nothing, await successor.take(row))
            again = Drafts(_gateway(sender, run_dir=tmp_path))  # the file no longer names a taken placeholder
            return tg.sent(chat_id=GROUP), outcome, again.views

    sent, outcome, left = asyncio.run(go())
    assert 1 == [s["kind"] for s in sent].count("text") and 1 == len({s["message_id"] for s in sent})
    assert "the first words and more, all of them" == sent[-1]["text"] and outcome == Sent(str(sent[0]["message_id"]))
    assert {} == left


def test_an_attempt_that_fails_before_its_edit_gives_the_placeholder_to_the_next():
    from services.gateway.delivery import Deliverer

    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            gateway = _gateway(sender)
            gateway.drafts = drafts = Drafts(gateway)
            drafts.show(_draft(GROUP, "a draft"))
            await asyncio.sleep(drafts_mod.FIRST_AFTER_S + 0.3)
            deliverer = Deliverer.__new__(Deliverer)  # its _deliver, without a bus: reports recorded here
            reports = []
            deliverer.gateway, deliverer.worker, deliverer.lease_s, deliverer.repeats = gateway, "w", 30.0, 0
            deliverer.in_flight, deliverer.wake, deliverer.log = {}, asyncio.Event(), _Log()

            async def report(op, _log):
                reports.append(op)

            deliverer._report = report
            gateway.channels["tg"].log = _Log()
            tg.script_error("*", "server", times=3)  # the edit, its second try and the fallback send all fail
            await deliverer._deliver(_row(GROUP, "the answer"))
            await deliverer._deliver(_row(GROUP, "the answer", attempt_=2))
            return tg.sent(chat_id=GROUP), reports

    sent, reports = asyncio.run(go())
    assert ["OutboxFailed", "OutboxSent"] == [type(r).__name__ for r in reports]
    assert [("text", "a draft"), ("edit", "the answer")] == [(s["kind"], s["text"]) for s in sent]


def test_a_done_draft_posts_no_placeholder_the_answer_is_on_its_way():
    async def go():
        async with FakeTelegram() as tg, aiohttp.ClientSession() as session:
            sender = TelegramSender(BotApi(tg.url, tg.token, session), _Log())
            drafts = Drafts(_gateway(sender))
            drafts.show(_draft(GROUP, "the whole answer", done=True))
            drafts.show(_draft(USER, "the whole answer", done=True))
            await asyncio.sleep(drafts_mod.FIRST_AFTER_S + 0.5)
            return tg.sent(), tg.drafts()

    assert ([], []) == asyncio.run(go())


def test_slack_posts_one_placeholder_in_the_thread_updates_it_and_the_answer_replaces_it():
    async def go():
        async with FakeSlack() as sl, aiohttp.ClientSession() as session:
            sl.add_channel("C0001", member=True)
            sender = SlackSender(SlackApi(sl.api_base, sl.bot_token, session), _Log())
            drafts = Drafts(_gateway(sender, "sl"))
            chat = "C0001:1700000000.000100"
            answer = await _stream(drafts, chat, 25, 0.1, instance="sl")
            row = _row(chat, answer + " *really*", instance="sl", approval_id="AB12CD")
            placeholder = await drafts.take(row)
            outcome = await send_row(sender, row, _nothing, placeholder)
            return sl.posted("C0001"), sl.updates("C0001"), outcome, placeholder

    posted, updates, outcome, placeholder = asyncio.run(go())
    assert 1 == len(posted) and "1700000000.000100" == posted[0]["thread_ts"] and placeholder == posted[0]["ts"]
    assert len(updates) >= 2 and {placeholder} == {u["ts"] for u in updates}
    assert updates[-1]["text"].endswith("_really_") and outcome == Sent(placeholder)
    assert "approval:AB12CD" == updates[-1]["blocks"][1]["block_id"]  # the buttons ride the final edit


def test_fakes_refuse_what_the_platforms_refuse():
    async def go():
        async with FakeTelegram() as tg, FakeSlack() as sl, aiohttp.ClientSession() as session:
            api = BotApi(tg.url, tg.token, session)
            answers = []
            for params in ({"chat_id": GROUP, "draft_id": 1, "text": "x"},
                           {"chat_id": USER, "draft_id": 0, "text": "x"},
                           {"chat_id": USER, "draft_id": 1, "text": ""},
                           {"chat_id": USER, "draft_id": 1, "text": "x" * (MAX_TEXT + 1)},
                           {"chat_id": USER, "draft_id": 1, "text": "<b>x", "parse_mode": "HTML"}):
                try:
                    answers.append(await api.call("sendMessageDraft", params))
                except Exception as exc:
                    answers.append(getattr(exc, "code", None))
            answers.append(await api.call("sendMessageDraft", {"chat_id": USER, "draft_id": 5, "text": "<b>ok</b>",
                                                               "parse_mode": "HTML"}))
            slack = SlackApi(sl.api_base, sl.bot_token, session)
            sl.message("C0002", "U0001", "a person's message", ts="1700000000.000200", deliver=False)
            refused = []
            for params in ({"channel": "C0002", "ts": "1700000000.000200", "text": "mine now"},
                           {"channel": "C0002", "ts": "1.2", "text": "x"}):
                try:
                    await slack.call("chat.update", params)
                except Exception as exc:
                    refused.append(getattr(exc, "error", None))
            ts = (await slack.call("chat.postMessage", {"channel": "C0002", "text": "bot"}))["ts"]
            try:
                await slack.call("chat.update", {"channel": "C0002", "ts": ts, "text": "y" * 40_001})
            except Exception as exc:
                refused.append(getattr(exc, "error", None))
            return answers, tg.drafts(), refused

    answers, recorded, refused = asyncio.run(go())
    assert [400, 400, 400, 400, 400, True] == answers
    assert [(USER, 5, "<b>ok</b>")] == [(d["chat_id"], d["draft_id"], d["text"]) for d in recorded]
    assert ["cant_update_message", "message_not_found", "msg_too_long"] == refused
