"""The Telegram gateway's other shapes: webhook mode, several bots in one process or split across
processes, a second poller on the same token (409), and resuming a long message after a crash."""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request

import aiohttp

from common import db
from common.secrets import set_secret
from schema import messages as m
from services.gateway.channel import Sent
from services.gateway.telegram.api import BotApi
from services.gateway.telegram.render import split_html, to_html
from services.gateway.telegram.outbound import Sender
from tests.fake_telegram import DEFAULT_TOKEN, FakeTelegram
from tests.procs import Proc, wait_until
from tests.telegram_stack import OWNER, stack

SECOND_TOKEN = "987654321:AASecondFakeBotTokenForTests_987654"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_turns(s, instance: str, chat: int) -> list[str]:
    return s.user_turns(instance, chat)


def instances_in(proc: Proc) -> set[str]:
    """The instances this process's own log lines name (a log file can hold an earlier process's too)."""
    lines = [json.loads(x) for x in proc.log_text().splitlines() if x.startswith("{")]
    return {x["instance"] for x in lines if x.get("pid") == proc.pid and "instance" in x}


def post(url: str, body: bytes, secret: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_webhook_mode_checks_the_secret_and_answers(tmp_path):
    port = free_port()
    hook = f"http://127.0.0.1:{port}/tg/hook"
    gateway = (f'[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{{TG}}"\nallow = [{OWNER}]\n'
               f'mode = "webhook"\nlisten = "127.0.0.1:{port}"\npublic_url = "{hook}"\nsecret_token = "tg-hook"\n')
    with stack(gateway=gateway) as s:
        set_secret(s.home.paths.secrets_file, "tg-hook", "hook-secret-0123456789")
        s.start_gateway()
        info = s.tg.webhook()["info"]
        assert (hook, 1) == (info["url"], info["max_connections"])  # one at a time: a chat's order holds
        s.tg.message("via the webhook", user=OWNER)
        assert "echo: via the webhook" == s.replies(OWNER, 1)[0]["text"]
        forged = json.dumps({"update_id": 99999, "message": {
            "message_id": 500, "date": 1, "chat": {"id": OWNER, "type": "private"},
            "from": {"id": OWNER, "is_bot": False, "first_name": "x"}, "text": "forged words"}}).encode()
        assert 401 == post(hook, forged, None)
        assert 401 == post(hook, forged, "hook-secret-wrong-0000000")
        assert 200 == post(hook, b"{not json", "hook-secret-0123456789")  # Telegram itself: skipped, not retried
        assert ["via the webhook"] == user_turns(s, "tg", OWNER)
        assert 200 == post(hook, forged, "hook-secret-0123456789")
        assert ["via the webhook", "forged words"] == user_turns(s, "tg", OWNER)  # stored before the 200
        assert 200 == post(hook, forged, "hook-secret-0123456789")  # a redelivery: no second turn
        assert 2 == len(user_turns(s, "tg", OWNER))
        assert "hook-secret-0123456789" not in s.gateway.log_text()


def test_two_bots_in_one_process_and_split_across_two(tmp_path):
    gateway = ('[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{TG}"\nallow = [42]\n'
               '[[gateways.telegram]]\nid = "tg2"\ntoken = "tg-token-2"\napi_base = "{TG}"\nallow = [42]\n')
    with stack(gateway=gateway, tokens=(DEFAULT_TOKEN, SECOND_TOKEN)) as s:
        s.start_gateway()
        s.tg.message("to the first", user=OWNER)
        s.tg.message("to the second", user=OWNER, bot=SECOND_TOKEN.split(":")[0])
        wait_until(lambda: len(s.tg.sent(chat_id=OWNER)) >= 2, 20, what="both answers")
        by_bot = {r["bot"]: r["text"] for r in s.tg.sent(chat_id=OWNER)}
        assert {123456789: "echo: to the first", 987654321: "echo: to the second"} == by_bot
        assert (["to the first"], ["to the second"]) == (user_turns(s, "tg", OWNER), user_turns(s, "tg2", OWNER))
        s.gateway.stop()
        # now one process per bot
        s.start_gateway("--instance", "tg")
        second = Proc(s.home, "gateway.telegram", "--instance", "tg2", "--name", "gateway-telegram-2")
        s.extra_procs.append(second)
        s.tg.message("again first", user=OWNER)
        s.tg.message("again second", user=OWNER, bot=SECOND_TOKEN.split(":")[0])
        wait_until(lambda: len(s.tg.sent(chat_id=OWNER)) >= 4, 20, what="both answers again")
        assert {"tg"} == instances_in(s.gateway) and {"tg2"} == instances_in(second)
        wrong = Proc(s.home, "gateway.telegram", "--instance", "nope", "--name", "gateway-telegram-3")
        assert 1 == wrong.popen.wait(20)
        assert "no such [[gateways.telegram]] id" in wrong.log_text()
        wrong.stop()


def test_a_second_poller_is_reported_and_polling_recovers(tmp_path):
    with stack() as s:
        s.start_gateway()

        def second_poller() -> bool:
            """A getUpdates of another process on the same token: Telegram ends the poll in flight with 409."""
            request = urllib.request.Request(f"{s.tg.bot_url()}/getUpdates", data=b'{"timeout": 0}',
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=5) as answer:
                assert json.load(answer)["ok"]
            return "telegram_conflict" in s.gateway.log_text()

        wait_until(second_poller, 15, interval=0.5, what="the conflict logged")
        s.tg.message("after the conflict", user=OWNER)
        assert "echo: after the conflict" == s.replies(OWNER, 1)[0]["text"]
        line = next(json.loads(x) for x in s.gateway.log_text().splitlines() if "telegram_conflict" in x)
        assert "one poller per token" in line["hint"] and "error" == line["level"]


def test_a_long_message_resumes_after_the_parts_already_sent():
    async def go():
        async with FakeTelegram() as fake, aiohttp.ClientSession() as session:
            log = _Log()
            sender = Sender(BotApi(fake.url, fake.token, session), log)
            sender.per_chat.limit = 100  # no pacing in this unit test
            body = "\n\n".join(f"paragraph {i} " + "word " * 150 for i in range(20))
            parts = split_html(to_html(body.strip()))
            assert len(parts) >= 3
            progress: list[int] = []

            async def record(n: int, _id: str) -> None:
                progress.append(n)

            item = m.OutboxItem(id=1, instance="tg", chat=str(OWNER), kind="text", body=body, file_path="",
                                reply_to="", attempt=2, parts_sent=1)
            outcome = await sender.send(item, record)
            sent = [r["text"] for r in fake.sent(chat_id=OWNER)]
            return outcome, sent, parts, progress

    outcome, sent, parts, progress = asyncio.run(go())
    assert isinstance(outcome, Sent)
    assert parts[1:] == sent  # the first part was delivered before the crash: not again
    assert list(range(2, len(parts))) == progress


class _Log:
    def __getattr__(self, name):
        return lambda *a, **k: None


def test_a_restarted_gateway_takes_back_what_its_predecessor_held(tmp_path):
    import socket as _socket

    with stack() as s:
        async def held_by_a_dead_gateway():
            async with s.home.client("test") as c:
                await c.call(m.EnqueueOutbox(instance="tg", chat=str(OWNER), replies=[m.Reply(text="left behind")]))
                claim = await c.call(m.ClaimOutbox(worker=f"gateway-telegram@{_socket.gethostname()}",
                                                   instances=["tg"], lease_s=3600))
                return claim.items

        assert 1 == len(asyncio.run(held_by_a_dead_gateway()))  # leased for an hour to "the previous process"
        s.start_gateway()
        assert "left behind" == s.replies(OWNER, 1, timeout=10)[0]["text"]


def test_replies_for_a_bot_that_cannot_start_wait_and_go_once_it_can(tmp_path):
    from common.stores import outbox_store

    gateway = ('[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{TG}"\nallow = [42]\n'
               '[[gateways.telegram]]\nid = "late"\ntoken = "late-token"\napi_base = "{TG}"\nallow = [42]\n')
    with stack(gateway=gateway, tokens=(DEFAULT_TOKEN, SECOND_TOKEN)) as s:
        s.start_gateway()  # "late" has no token yet: it says so and retries; "tg" works meanwhile
        asyncio.run(_enqueue(s, "late", "queued while the token was missing"))
        s.tg.message("meanwhile", user=OWNER)
        assert "echo: meanwhile" == s.replies(OWNER, 1)[0]["text"]

        def row():
            conn = s.reader()
            with db.read_tx(conn):
                return outbox_store.for_chat(conn, "late", str(OWNER))[0]

        assert ("pending", 0) == (row().state, row().attempts)  # not claimed, so not failed by retries
        set_secret(s.home.paths.secrets_file, "late-token", SECOND_TOKEN)
        wait_until(lambda: row().state == "sent", 30, what="the queued reply once the bot started")
        assert ["queued while the token was missing"] == [
            r["text"] for r in s.tg.sent(chat_id=OWNER, bot=SECOND_TOKEN.split(":")[0])]


async def _enqueue(s, instance: str, text: str) -> None:
    async with s.home.client("test") as c:
        await c.call(m.EnqueueOutbox(instance=instance, chat=str(OWNER), replies=[m.Reply(text=text)]))


class _DeadLetters:
    def __init__(self) -> None:
        self.kept: list[tuple[str, object, str]] = []

    async def keep(self, channel, event_key: str, raw: object, reason: str) -> None:
        self.kept.append((event_key, raw, reason))


async def _poll_until_offset(handle_batch, tries: int = 3, hold_s: float = 0.01):
    """A polling channel against the fake Bot API whose batches go to ``handle_batch``: (calls, offset,
    the update's id, what was kept as a dead letter) once the offset moved past the update."""
    from types import SimpleNamespace

    from services.gateway.telegram import channel as tgc

    async with FakeTelegram() as fake, aiohttp.ClientSession() as session:
        ch = tgc.TelegramChannel.__new__(tgc.TelegramChannel)
        ch.api, ch.log, ch.offset, ch.failures = BotApi(fake.url, fake.token, session), _Log(), None, 0
        ch.cfg, ch.id = SimpleNamespace(mode="polling"), "tg"
        ch.gateway = SimpleNamespace(dead_letters=_DeadLetters())
        ch.handle_batch = handle_batch
        first = fake.message("poison", user=OWNER)["update_id"]
        old = (tgc.BATCH_TRIES, tgc.HOLD_S)
        tgc.BATCH_TRIES, tgc.HOLD_S = tries, hold_s
        try:
            task = asyncio.create_task(ch._poll())
            for _ in range(400):
                if ch.offset is not None:
                    break
                await asyncio.sleep(0.025)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        finally:
            tgc.BATCH_TRIES, tgc.HOLD_S = old
        return ch.offset, first, ch.gateway.dead_letters.kept


def test_a_batch_the_writer_cannot_store_keeps_its_offset_past_any_count_of_tries():
    from common.errors import WriteRejected

    calls = []

    async def full_disk_for_a_while(updates):
        calls.append([u["update_id"] for u in updates])
        if len(calls) <= 20:  # far past BATCH_TRIES: a full disk is the writer's condition, never the update's
            raise WriteRejected("disk_full", "the data disk is full")

    offset, first, kept = asyncio.run(_poll_until_offset(full_disk_for_a_while))
    assert len(calls) == 21 and all(c == [first] for c in calls)  # the same update every time, not passed over
    assert offset == first + 1 and kept == []  # confirmed only once stored


def test_a_batch_that_keeps_failing_for_a_bug_is_kept_as_dead_letters_then_passed_over():
    calls = []

    async def poisoned(updates):
        calls.append([u["update_id"] for u in updates])
        raise ValueError("a bug on this update")

    offset, first, kept = asyncio.run(_poll_until_offset(poisoned))
    assert 3 == len(calls) and offset == first + 1  # tried 3 times, then the offset moved past it...
    assert [(k, raw["update_id"]) for k, raw, _ in kept] == [(f"tg:tg:u:{first}", first)]  # ...kept whole
    assert "a bug on this update" in kept[0][2]
