"""The fake Telegram Bot API (tests/fake_telegram.py) behaves like the parts of the real one the gateway uses."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.fake_telegram import (
    DEFAULT_TOKEN,
    FakeTelegram,
    FakeTelegramProcess,
    auto_entities,
    utf16_len,
)

OTHER_TOKEN = "987654321:AAOtherFakeBotToken"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


async def api(s: aiohttp.ClientSession, tg: FakeTelegram, method: str, token: str | None = None,
              **params: Any) -> tuple[int, dict[str, Any]]:
    async with s.post(f"{tg.url}/bot{token or tg.token}/{method}", json=params) as r:
        return r.status, await r.json()


def ok(reply: tuple[int, dict[str, Any]]) -> Any:
    status, body = reply
    assert status == 200 and body["ok"] is True, body
    return body["result"]


def test_offset_confirms_and_forgets() -> None:
    async def go() -> None:
        async with FakeTelegram() as tg, aiohttp.ClientSession() as s:
            u1, u2, u3 = (tg.message(t, user=7) for t in ("one", "two", "three"))
            assert u2["update_id"] == u1["update_id"] + 1 and u3["update_id"] == u2["update_id"] + 1
            got = ok(await api(s, tg, "getUpdates"))
            assert [u["message"]["text"] for u in got] == ["one", "two", "three"]
            assert got[0]["message"]["chat"] == {"id": 7, "type": "private", "first_name": "User7", "username": "user7"}
            assert [u["update_id"] for u in ok(await api(s, tg, "getUpdates", limit=1))] == [u1["update_id"]]
            # offset N confirms everything below N: those are gone for good
            got = ok(await api(s, tg, "getUpdates", offset=u2["update_id"]))
            assert [u["update_id"] for u in got] == [u2["update_id"], u3["update_id"]]
            assert [u["update_id"] for u in ok(await api(s, tg, "getUpdates"))] == [u2["update_id"], u3["update_id"]]
            assert ok(await api(s, tg, "getUpdates", offset=u3["update_id"] + 1)) == []
            assert tg.pending_updates() == []
            # a negative offset keeps only the last ones
            for t in "abc":
                tg.message(t)
            assert [u["message"]["text"] for u in ok(await api(s, tg, "getUpdates", offset=-1))] == ["c"]
            assert len(tg.pending_updates()) == 1
            # GET with a query string and a urlencoded form work too
            async with s.get(f"{tg.bot_url()}/getUpdates?offset=0&timeout=0") as r:
                assert [u["message"]["text"] for u in (await r.json())["result"]] == ["c"]
            async with s.post(f"{tg.bot_url()}/getme", data={"x": "1"}) as r:
                me = (await r.json())["result"]
            assert me["id"] == 123456789 and me["is_bot"] is True
            assert [r["method"] for r in tg.requests()][-2:] == ["getUpdates", "getme"]
            assert DEFAULT_TOKEN not in json.dumps(tg.requests())

    run(go())


def test_long_poll_wakes_on_inject_and_times_out_empty() -> None:
    async def go() -> None:
        async with FakeTelegram() as tg, aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            poll = asyncio.create_task(api(s, tg, "getUpdates", timeout=5))
            await asyncio.sleep(0.2)
            assert not poll.done()
            tg.message("/start@fake123456789_bot hi @someone")
            got = ok(await poll)
            assert time.monotonic() - t0 < 2
            assert got[0]["message"]["entities"] == [
                {"offset": 0, "length": 24, "type": "bot_command"}, {"offset": 28, "length": 8, "type": "mention"},
            ]
            t0 = time.monotonic()
            assert ok(await api(s, tg, "getUpdates", offset=got[0]["update_id"] + 1, timeout=0.5)) == []
            assert 0.45 <= time.monotonic() - t0 < 2
            # a poll in flight ends (empty) when the server stops, not after its timeout
            poll = asyncio.create_task(api(s, tg, "getUpdates", offset=got[0]["update_id"] + 1, timeout=30))
            await asyncio.sleep(0.1)
            t0 = time.monotonic()
            await tg.stop()
            assert ok(await poll) == [] and time.monotonic() - t0 < 3

    run(go())


def test_two_pollers_conflict_and_unknown_token() -> None:
    async def go() -> None:
        async with FakeTelegram([DEFAULT_TOKEN, OTHER_TOKEN]) as tg, aiohttp.ClientSession() as s:
            first = asyncio.create_task(api(s, tg, "getUpdates", timeout=5))
            await asyncio.sleep(0.1)
            second = asyncio.create_task(api(s, tg, "getUpdates", timeout=5))
            status, body = await first
            assert status == 409 and body["error_code"] == 409
            assert body["description"].startswith("Conflict: terminated by other getUpdates request")
            tg.message("for the second poller")
            assert ok(await second)[0]["message"]["text"] == "for the second poller"
            # the other bot has its own queue and its own poller
            tg.message("other", bot=OTHER_TOKEN)
            assert [u["message"]["text"] for u in ok(await api(s, tg, "getUpdates", OTHER_TOKEN))] == ["other"]
            status, body = await api(s, tg, "getUpdates", "111:nope")
            assert (status, body) == (401, {"ok": False, "error_code": 401, "description": "Unauthorized"})
            status, body = await api(s, tg, "noSuchMethod")
            assert status == 404 and body["description"] == "Not Found"

    run(go())


def test_send_message_recorded_and_validated() -> None:
    async def go() -> None:
        async with FakeTelegram() as tg, aiohttp.ClientSession() as s:
            incoming = tg.message("question", user=42)["message"]
            m1 = ok(await api(s, tg, "sendMessage", chat_id=42, text="<b>bold</b> &lt;3", parse_mode="HTML",
                              reply_parameters={"message_id": incoming["message_id"]}))
            assert m1["text"] == "bold <3" and m1["reply_to_message"]["text"] == "question"
            assert m1["message_id"] == incoming["message_id"] + 1
            ok(await api(s, tg, "sendMessage", chat_id=42, text="plain", reply_to_message_id=m1["message_id"]))
            ok(await api(s, tg, "sendChatAction", chat_id=42, action="typing"))
            sent = tg.sent(chat_id=42)
            assert [(x["kind"], x["text"], x["parse_mode"], x["reply_to"]) for x in sent] == [
                ("text", "<b>bold</b> &lt;3", "HTML", incoming["message_id"]),
                ("text", "plain", None, m1["message_id"]),
            ]
            assert [a["action"] for a in tg.actions(42)] == ["typing"]
            # 4096 UTF-16 units: 2048 emoji fit, 2049 do not; tags do not count, their text does
            assert utf16_len("😀" * 2048) == 4096
            ok(await api(s, tg, "sendMessage", chat_id=42, text="😀" * 2048))
            ok(await api(s, tg, "sendMessage", chat_id=42, text="<b>" + "x" * 4096 + "</b>", parse_mode="HTML"))
            for text, mode in (("😀" * 2049, None), ("x" * 4097, None), ("&lt;" * 4097, "HTML")):
                status, body = await api(s, tg, "sendMessage", chat_id=42, text=text, parse_mode=mode)
                assert (status, body["description"]) == (400, "Bad Request: message is too long")
            for bad in ("<b>unclosed", "<foo>x</foo>", "1 < 2", "<b><i>x</b></i>", "x</b>"):
                status, body = await api(s, tg, "sendMessage", chat_id=42, text=bad, parse_mode="HTML")
                assert status == 400 and body["description"].startswith("Bad Request: can't parse entities: "), bad
            ok(await api(s, tg, "sendMessage", chat_id=42, text="1 < 2", parse_mode="MarkdownV2"))  # not HTML
            status, body = await api(s, tg, "sendMessage", chat_id=42, text="   ")
            assert (status, body["description"]) == (400, "Bad Request: message text is empty")
            status, body = await api(s, tg, "sendMessage", chat_id=42, text="x", reply_to_message_id=999)
            assert (status, body["description"]) == (400, "Bad Request: message to be replied not found")
            assert len(tg.sent(42)) == 5  # only the accepted ones
            edited = ok(await api(s, tg, "editMessageText", chat_id=42, message_id=m1["message_id"], text="new"))
            assert edited["text"] == "new" and tg.sent(42)[-1]["kind"] == "edit"

    run(go())


def test_scripted_errors_flood_blocked_migrate_server() -> None:
    async def go() -> None:
        async with FakeTelegram() as tg, aiohttp.ClientSession() as s:
            tg.script_error("sendMessage", "flood", times=2, retry_after=3)
            for _ in range(2):
                status, body = await api(s, tg, "sendMessage", chat_id=5, text="hi")
                assert status == 429 and body == {
                    "ok": False, "error_code": 429, "description": "Too Many Requests: retry after 3",
                    "parameters": {"retry_after": 3},
                }
            ok(await api(s, tg, "sendMessage", chat_id=5, text="hi"))
            # for one chat only
            tg.script_error("sendMessage", "blocked", chat_id=6)
            ok(await api(s, tg, "sendMessage", chat_id=5, text="still fine"))
            status, body = await api(s, tg, "sendMessage", chat_id=6, text="x")
            assert (status, body["description"]) == (403, "Forbidden: bot was blocked by the user")
            ok(await api(s, tg, "sendMessage", chat_id=6, text="once only"))
            tg.script_error("sendMessage", "migrate", migrate_to_chat_id=-1009999)
            status, body = await api(s, tg, "sendMessage", chat_id=-77, text="x")
            assert status == 400 and body["parameters"] == {"migrate_to_chat_id": -1009999}
            assert body["description"] == "Bad Request: group chat was upgraded to a supergroup chat"
            tg.script_error("getUpdates", "server")
            status, body = await api(s, tg, "getUpdates")
            assert (status, body["error_code"]) == (500, 500)
            tg.script_error("sendMessage", "parse")
            status, body = await api(s, tg, "sendMessage", chat_id=5, text="fine text")
            assert status == 400 and "can't parse entities" in body["description"]
            assert tg.scripted == []
            # lasting states: a user who blocked the bot, a group that became a supergroup
            tg.block(8)
            tg.migrate(-55, -100555)
            for _ in range(2):
                assert (await api(s, tg, "sendMessage", chat_id=8, text="x"))[0] == 403
                status, body = await api(s, tg, "sendChatAction", chat_id=-55, action="typing")
                assert status == 400 and body["parameters"]["migrate_to_chat_id"] == -100555
            # per-chat flood control, switched on by the test
            tg.set_rate_limit(1.0)
            ok(await api(s, tg, "sendMessage", chat_id=9, text="first"))
            ok(await api(s, tg, "sendMessage", chat_id=10, text="another chat"))
            status, body = await api(s, tg, "sendMessage", chat_id=9, text="too soon")
            assert status == 429 and body["parameters"]["retry_after"] == 1
            tg.set_rate_limit(None)
            ok(await api(s, tg, "sendMessage", chat_id=9, text="limit off"))
            assert [x["text"] for x in tg.sent(9)] == ["first", "limit off"]
            with pytest.raises(ValueError):
                tg.script_error("sendMessage", "nonsense")

    run(go())


def test_webhook_delivery_secret_and_retry() -> None:
    async def go() -> None:
        hits: list[tuple[str | None, dict[str, Any]]] = []
        answers = [500, 200, 200]

        async def hook(request: web.Request) -> web.Response:
            hits.append((request.headers.get("X-Telegram-Bot-Api-Secret-Token"), await request.json()))
            return web.Response(status=answers[min(len(hits), len(answers)) - 1])

        app = web.Application()
        app.add_routes([web.post("/hook", hook)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        hook_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"
        try:
            async with FakeTelegram(webhook_backoff=(0.05, 0.2)) as tg, aiohttp.ClientSession() as s:
                status, body = await api(s, tg, "setWebhook", url=hook_url, secret_token="bad secret!")
                assert status == 400
                assert ok(await api(s, tg, "setWebhook", url=hook_url, secret_token="s3cret_-x")) is True
                status, body = await api(s, tg, "getUpdates")
                assert status == 409 and "webhook is active" in body["description"]
                u1 = tg.message("first")
                u2 = tg.message("second")
                for _ in range(100):
                    if len(hits) >= 3 and not tg.pending_updates():
                        break
                    await asyncio.sleep(0.02)
                assert [h[0] for h in hits] == ["s3cret_-x"] * 3
                assert [h[1]["update_id"] for h in hits] == [u1["update_id"], u1["update_id"], u2["update_id"]]
                assert [(d["attempt"], d["status"]) for d in tg.deliveries] == [(1, 500), (2, 200), (1, 200)]
                info = ok(await api(s, tg, "getWebhookInfo"))
                assert info["url"] == hook_url and info["pending_update_count"] == 0
                assert "500" in info["last_error_message"]
                assert ok(await api(s, tg, "deleteWebhook")) is True
                tg.message("polled again")
                assert ok(await api(s, tg, "getUpdates"))[0]["message"]["text"] == "polled again"
                assert len(hits) == 3
        finally:
            await runner.cleanup()

    run(go())


def test_files_get_file_download_and_uploads() -> None:
    async def go() -> None:
        async with FakeTelegram() as tg, aiohttp.ClientSession() as s:
            photo = tg.photo(b"\xff\xd8 jpeg bytes", caption="look", user=3)["message"]
            doc = tg.document(b"%PDF-1.4", file_name="a.pdf", mime_type="application/pdf", chat_id=-1001234567890,
                              user=3)["message"]
            voice = tg.voice(b"OggS voice", duration=2, user=3)["message"]
            big = tg.document(b"tiny", size=25 * 1024 * 1024, user=3)["message"]
            assert doc["chat"]["type"] == "supergroup" and doc["document"]["file_size"] == 8
            for ref, content in ((photo["photo"][-1], b"\xff\xd8 jpeg bytes"), (doc["document"], b"%PDF-1.4"),
                                 (voice["voice"], b"OggS voice")):
                f = ok(await api(s, tg, "getFile", file_id=ref["file_id"]))
                assert f["file_size"] == len(content) and f["file_path"]
                async with s.get(tg.file_url(f["file_path"])) as r:
                    assert r.status == 200 and await r.read() == content
            status, body = await api(s, tg, "getFile", file_id=big["document"]["file_id"])
            assert (status, body["description"]) == (400, "Bad Request: file is too big")
            status, body = await api(s, tg, "getFile", file_id="nope")
            assert (status, body["description"]) == (400, "Bad Request: invalid file_id")
            async with s.get(f"{tg.url}/file/bot{tg.token}/documents/missing") as r:
                assert r.status == 404
            # a multipart upload is recorded and becomes downloadable under the file_id Telegram returns
            form = aiohttp.FormData()
            form.add_field("chat_id", "3")
            form.add_field("caption", "<i>report</i>")
            form.add_field("parse_mode", "HTML")
            form.add_field("document", b"col1,col2\n", filename="r.csv", content_type="text/csv")
            async with s.post(f"{tg.bot_url()}/sendDocument", data=form) as r:
                sent_doc = (await r.json())["result"]["document"]
            assert sent_doc["file_name"] == "r.csv" and sent_doc["file_size"] == 10
            assert tg.sent(3)[-1]["kind"] == "document" and tg.sent(3)[-1]["text"] == "<i>report</i>"
            assert tg.requests("sendDocument")[-1]["params"]["document"]["size"] == 10
            f = ok(await api(s, tg, "getFile", file_id=sent_doc["file_id"]))
            async with s.get(tg.file_url(f["file_path"])) as r:
                assert await r.read() == b"col1,col2\n"
            status, body = await api(s, tg, "sendPhoto", chat_id=3, photo="not-a-file-id")
            assert status == 400

    run(go())


def test_raw_and_edited_updates() -> None:
    async def go() -> None:
        async with FakeTelegram() as tg, aiohttp.ClientSession() as s:
            m = tg.message("hello @fake123456789_bot", chat_id=-500, user={"id": 9, "first_name": "Bo"})["message"]
            assert m["chat"] == {"id": -500, "type": "group", "title": "Group -500"}
            tg.edited_message(m["message_id"], "hello again", chat_id=-500)
            tg.message("answer", chat_id=-500, user=9, reply_to=m["message_id"])
            tg.inject({"update_id": "garbage", "message": None})
            tg.inject("not even an object")
            got = ok(await api(s, tg, "getUpdates"))
            assert got[1]["edited_message"]["text"] == "hello again" and "edit_date" in got[1]["edited_message"]
            assert got[2]["message"]["reply_to_message"]["text"] == "hello again"  # the message as it is now
            assert got[3] == {"update_id": got[2]["update_id"] + 1, "message": None}
            assert got[4] == "not even an object"
            assert auto_entities("/help") == [{"offset": 0, "length": 5, "type": "bot_command"}]

    run(go())


def test_process_mode(tmp_path: Path) -> None:
    with FakeTelegramProcess(tmp_path / "tg") as tg:
        assert (tmp_path / "tg" / "fake_telegram.port").read_text().strip() == str(tg.port)
        tg.message("from the control endpoint", user=11)
        tg.script_error("sendMessage", "flood", retry_after=2)
        with urllib.request.urlopen(f"{tg.bot_url()}/getUpdates?timeout=1", timeout=5) as r:
            updates = json.loads(r.read())["result"]
        assert updates[0]["message"]["text"] == "from the control endpoint"
        req = urllib.request.Request(f"{tg.bot_url()}/sendMessage", method="POST",
                                     data=json.dumps({"chat_id": 11, "text": "hi"}).encode(),
                                     headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 429 and json.loads(e.value.read())["parameters"] == {"retry_after": 2}
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["ok"] is True
        assert [x["text"] for x in tg.sent(11)] == ["hi"]
        f = tg.add_file(b"abc")
        with urllib.request.urlopen(f"{tg.url}/file/bot{tg.token}/{f['file_path']}", timeout=5) as r:
            assert r.read() == b"abc"
        assert [r["method"] for r in tg.requests()] == ["getUpdates", "sendMessage", "sendMessage", "file"]
        proc = tg.proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
