"""The fake Slack (tests/fake_slack.py) behaves like the parts of Slack the gateway uses."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fake_slack import (
    DEFAULT_APP_TOKEN,
    DEFAULT_BOT_TOKEN,
    DEFAULT_SIGNING_SECRET,
    SLACK_RETRY_DELAYS,
    FakeSlack,
    FakeSlackProcess,
    post_event,
    url_verification,
)

WS = aiohttp.WSMsgType


def run(coro: Any, timeout: float = 10) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def call(s: aiohttp.ClientSession, sl: FakeSlack, method: str, token: str | None = DEFAULT_BOT_TOKEN,
               **params: Any) -> tuple[int, dict[str, Any], Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with s.post(f"{sl.api_base}/{method}", json=params, headers=headers) as r:
        return r.status, await r.json(), r.headers


async def ok(s: aiohttp.ClientSession, sl: FakeSlack, method: str, **params: Any) -> dict[str, Any]:
    status, body, _ = await call(s, sl, method, **params)
    assert status == 200 and body["ok"] is True, body
    return body


async def err(s: aiohttp.ClientSession, sl: FakeSlack, method: str, **params: Any) -> str:
    status, body, _ = await call(s, sl, method, **params)
    assert status == 200 and body["ok"] is False, body
    return body["error"]


async def connect(s: aiohttp.ClientSession, sl: FakeSlack, token: str = DEFAULT_APP_TOKEN,
                  **kw: Any) -> aiohttp.ClientWebSocketResponse:
    """apps.connections.open (form-encoded, as the docs show) and the WebSocket; the hello is checked here."""
    async with s.post(f"{sl.api_base}/apps.connections.open", data={},
                      headers={"Authorization": f"Bearer {token}"}) as r:
        url = (await r.json())["url"]
    assert url.startswith(f"ws://127.0.0.1:{sl.port}/socket?ticket=")
    ws = await s.ws_connect(url, **kw)
    hello = await ws.receive_json(timeout=2)
    assert hello["type"] == "hello" and hello["connection_info"]["app_id"] == url.rsplit("app_id=", 1)[1]
    assert hello["num_connections"] >= 1 and hello["debug_info"]["approximate_connection_time"] > 0
    return ws


async def frame(ws: aiohttp.ClientWebSocketResponse, timeout: float = 2) -> dict[str, Any]:
    return await ws.receive_json(timeout=timeout)


def test_web_api_auth_posts_and_their_errors() -> None:
    async def go() -> None:
        async with FakeSlack() as sl, aiohttp.ClientSession() as s:
            me = await ok(s, sl, "auth.test")
            assert (me["user_id"], me["team_id"], me["bot_id"]) == (sl.bot_user_id, sl.team_id, sl.bot_id)
            assert (await call(s, sl, "auth.test", token="xoxb-nope"))[1]["error"] == "invalid_auth"
            assert (await call(s, sl, "auth.test", token=None))[1]["error"] == "not_authed"
            assert (await call(s, sl, "chat.postMessage", token=DEFAULT_APP_TOKEN))[1]["error"] == "not_allowed_token_type"
            assert (await call(s, sl, "apps.connections.open"))[1]["error"] == "not_allowed_token_type"
            assert await err(s, sl, "no.such") == "unknown_method"
            # a token in a JSON body counts for nothing; in a form it does
            async with s.post(f"{sl.api_base}/auth.test", json={"token": DEFAULT_BOT_TOKEN}) as r:
                assert (await r.json())["error"] == "not_authed"
            async with s.post(f"{sl.api_base}/auth.test", data={"token": DEFAULT_BOT_TOKEN}) as r:
                assert (await r.json())["ok"] is True

            assert await err(s, sl, "chat.postMessage", channel="C0001", text="hi") == "channel_not_found"
            sl.add_channel("C0001", name="general")
            t0 = time.time()
            first = await ok(s, sl, "chat.postMessage", channel="C0001", text="*hi*", mrkdwn=True)
            blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "approve?"}},
                      {"type": "actions", "elements": [{"type": "button", "action_id": "approve", "value": "1"}]}]
            # form-encoded, blocks as a JSON string, in a thread
            async with s.post(f"{sl.api_base}/chat.postMessage", headers={"Authorization": f"Bearer {sl.bot_token}"},
                              data={"channel": "C0001", "text": "in thread", "thread_ts": first["ts"],
                                    "blocks": json.dumps(blocks)}) as r:
                second = await r.json()
            assert second["ok"] and float(second["ts"]) > float(first["ts"]) and second["message"]["thread_ts"] == first["ts"]
            assert [(p["text"], p["thread_ts"], p["ts"]) for p in sl.posted("C0001")] == [
                ("*hi*", None, first["ts"]), ("in thread", first["ts"], second["ts"])]
            assert sl.posted(thread_ts=first["ts"])[0]["blocks"] == blocks
            assert sl.posted(since=t0) == sl.posted() and sl.posted(since=time.time() + 1) == []
            assert await err(s, sl, "chat.postMessage", channel="C0001", text="x" * 40001) == "msg_too_long"
            assert await ok(s, sl, "chat.postMessage", channel="C0001", text="x" * 40000)
            assert await err(s, sl, "chat.postMessage", channel="C0001", text=" ") == "no_text"
            assert await err(s, sl, "chat.postMessage", channel="C0001", blocks=[{"no": "type"}]) == "invalid_blocks"
            sl.add_channel("C0001", member=False)
            assert await err(s, sl, "chat.postMessage", channel="C0001", text="hi") == "not_in_channel"
            sl.add_channel("C0001", member=True)

            upd = await ok(s, sl, "chat.update", channel="C0001", ts=first["ts"], text="edited")
            assert upd["text"] == "edited" and sl.updates("C0001")[0]["ts"] == first["ts"]
            user_msg = sl.message("C0001", "U0001", "hello", deliver=False)["payload"]["event"]
            assert await err(s, sl, "chat.update", channel="C0001", ts=user_msg["ts"], text="x") == "cant_update_message"
            await ok(s, sl, "reactions.add", channel="C0001", name="eyes", timestamp=user_msg["ts"])
            assert await err(s, sl, "reactions.add", channel="C0001", name="eyes", timestamp=user_msg["ts"]) == "already_reacted"
            await ok(s, sl, "reactions.remove", channel="C0001", name="eyes", timestamp=user_msg["ts"])
            assert await err(s, sl, "reactions.remove", channel="C0001", name="eyes", timestamp=user_msg["ts"]) == "no_reaction"
            assert await err(s, sl, "reactions.add", channel="C0001", name="eyes", timestamp="1.000001") == "message_not_found"
            assert [r["action"] for r in sl.reactions("C0001", name="eyes")] == ["add", "remove"]
            await ok(s, sl, "assistant.threads.setStatus", channel_id="C0001", thread_ts=first["ts"], status="is thinking...")
            assert sl.statuses("C0001")[0]["status"] == "is thinking..."

            thread = (await ok(s, sl, "conversations.replies", channel="C0001", ts=first["ts"]))["messages"]
            assert [m["text"] for m in thread] == ["edited", "in thread"]
            assert (await ok(s, sl, "users.info", user="U0001"))["user"]["id"] == "U0001"
            sl.message("D0009", "U0002", "dm", deliver=False)  # an event names the channel: now it is known
            assert (await ok(s, sl, "conversations.info", channel="D0009"))["channel"].items() >= {"is_im": True, "user": "U0002"}.items()
            assert DEFAULT_BOT_TOKEN not in json.dumps(sl.requests())
            assert {r["method"] for r in sl.requests(status=200)} >= {"auth.test", "chat.postMessage", "chat.update"}

    run(go())


def test_scripted_errors_and_rate_limits() -> None:
    async def go() -> None:
        async with FakeSlack() as sl, aiohttp.ClientSession() as s:
            for c in ("C1", "C2"):
                sl.add_channel(c)
            sl.script_error("chat.postMessage", "ratelimited", retry_after=2)
            status, body, headers = await call(s, sl, "chat.postMessage", channel="C1", text="a")
            assert (status, body, headers["Retry-After"]) == (429, {"ok": False, "error": "ratelimited"}, "2")
            await ok(s, sl, "chat.postMessage", channel="C1", text="a")
            sl.script_error("chat.postMessage", "not_in_channel", channel="C2", times=2)
            await ok(s, sl, "chat.postMessage", channel="C1", text="b")  # the rule is for C2 only
            assert await err(s, sl, "chat.postMessage", channel="C2", text="b") == "not_in_channel"
            assert await err(s, sl, "chat.postMessage", channel="C2", text="b") == "not_in_channel"
            await ok(s, sl, "chat.postMessage", channel="C2", text="b")
            sl.script_error("*", "internal_error", http_status=500)
            assert (await call(s, sl, "auth.test"))[0] == 500
            assert sl.scripted == []
            # per-channel flood control: one message a second per channel, as chat.postMessage documents
            sl.set_rate_limit(0.5)
            await ok(s, sl, "chat.postMessage", channel="C1", text="c")
            status, _, headers = await call(s, sl, "chat.postMessage", channel="C1", text="d")
            assert status == 429 and headers["Retry-After"] == "1"
            await ok(s, sl, "chat.postMessage", channel="C2", text="d")  # another channel is not held up
            await asyncio.sleep(0.5)
            await ok(s, sl, "chat.postMessage", channel="C1", text="d")
            sl.set_rate_limit(None)
            assert [p["text"] for p in sl.posted("C1")] == ["a", "b", "c", "d"]

    run(go())


def test_upload_flow_and_private_downloads() -> None:
    async def go() -> None:
        async with FakeSlack() as sl, aiohttp.ClientSession() as s:
            sl.add_channel("D0001")
            data = b"%PDF- fake report" * 100
            got = await ok(s, sl, "files.getUploadURLExternal", filename="report.pdf", length=len(data))
            assert got["upload_url"].startswith(sl.url) and got["file_id"].startswith("F")
            assert await err(s, sl, "files.completeUploadExternal", files=[{"id": got["file_id"]}]) == "file_not_found"
            async with s.post(got["upload_url"], data=data) as r:
                assert (r.status, await r.text()) == (200, f"OK - {len(data)}")
            async with s.post(f"{sl.api_base}/files.completeUploadExternal",
                              headers={"Authorization": f"Bearer {sl.bot_token}"},
                              data={"files": json.dumps([{"id": got["file_id"], "title": "Report"}]),
                                    "channel_id": "D0001", "thread_ts": "1700000000.000100",
                                    "initial_comment": "here"}) as r:
                done = await r.json()
            assert done["ok"] and done["files"][0]["id"] == got["file_id"]
            [up] = sl.uploads("D0001")
            assert (up["name"], up["title"], up["bytes"], up["thread_ts"]) == ("report.pdf", "Report", len(data),
                                                                                "1700000000.000100")
            assert sl.upload_content(got["file_id"]) == data
            assert await err(s, sl, "files.getUploadURLExternal", filename="x", length=0) == "invalid_arguments"
            # multipart upload, as curl -F does
            got2 = await ok(s, sl, "files.getUploadURLExternal", filename="a.txt", length=3)
            form = aiohttp.FormData()
            form.add_field("file", b"abc", filename="a.txt")
            async with s.post(got2["upload_url"], data=form) as r:
                assert r.status == 200
            await ok(s, sl, "files.completeUploadExternal", files=[{"id": got2["file_id"]}])
            assert sl.upload_content(got2["file_id"]) == b"abc" and sl.uploads(file_id=got2["file_id"])[0]["channel"] is None

            # an inbound share: url_private_download wants the bot token
            f = sl.add_file(b"secret bytes", name="notes.txt")
            url = f["url_private_download"]
            async with s.get(url, allow_redirects=False) as r:
                assert r.status == 302
            async with s.get(url, headers={"Authorization": "Bearer xoxb-wrong"}) as r:
                assert r.status == 200 and r.content_type == "text/html"  # the sign-in page, not the file
            async with s.get(url, headers={"Authorization": f"Bearer {sl.bot_token}"}) as r:
                assert (r.status, await r.read()) == (200, b"secret bytes")
            env = sl.message("D0001", "U0001", "see file", files=[f, ("b.bin", b"\x00\x01")], deliver=False)
            ev = env["payload"]["event"]
            assert ev["subtype"] == "file_share" and [x["name"] for x in ev["files"]] == ["notes.txt", "b.bin"]

    run(go())


def test_redelivery_at_slacks_spacing_scaled() -> None:
    """Slack's retries, a hundred times faster: an envelope never acked comes 4 times in all, the retries
    at once after the 3 s timeout (0.03 s), then 0.6 s and 3 s later (1 and 5 minutes), then it expires;
    one acked during a wait is not sent again."""
    scale = 0.01
    async def go() -> None:
        async with FakeSlack(ack_timeout=3 * scale, max_retries=3) as sl, aiohttp.ClientSession() as s:
            sl.configure(retry_delays=[d * scale for d in SLACK_RETRY_DELAYS])
            ws = await connect(s, sl)
            sl.message("D0001", "U0001", "never acked")
            got = []
            for _ in range(4):
                env = await frame(ws, 5)
                got.append((env["retry_attempt"], time.monotonic()))
            assert [a for a, _ in got] == [0, 1, 2, 3]
            gaps = [b - a for (_, a), (_, b) in zip(got, got[1:])]
            assert 0.02 <= gaps[0] < 0.3, gaps             # the timeout, then at once
            assert 0.6 <= gaps[1] < 0.6 + 0.3, gaps        # a minute more
            assert 3.0 <= gaps[2] < 3.0 + 0.4, gaps        # five minutes more
            assert (await sl.wait_for("expired", 1, timeout=2))[0]["attempt"] == 3
            with pytest.raises(asyncio.TimeoutError):
                await frame(ws, 0.3)

            sl.message("D0001", "U0001", "acked late")
            first = await frame(ws, 5)
            await frame(ws, 1)  # the immediate retry
            await asyncio.sleep(0.1)  # now inside the minute's wait: an ack of the first attempt ends it
            await ws.send_json({"envelope_id": first["envelope_id"]})
            await sl.wait_for("acks", 1)
            with pytest.raises(asyncio.TimeoutError):
                await frame(ws, 1.0)
            assert sl.pending() == []
            with pytest.raises(ValueError):
                sl.configure(retry_delays=[-1])

    run(go())


def test_socket_mode_hello_envelopes_acks_and_redelivery() -> None:
    async def go() -> None:
        async with FakeSlack(ack_timeout=0.3, max_retries=2) as sl, aiohttp.ClientSession() as s:
            ws = await connect(s, sl)
            env = sl.message("D0001", "U0001", "hello bot")
            first = await frame(ws)
            assert first == env and first["type"] == "events_api" and first["accepts_response_payload"] is False
            assert (first["retry_attempt"], first["retry_reason"]) == (0, "")
            p = first["payload"]
            assert p["type"] == "event_callback" and p["team_id"] == sl.team_id and p["api_app_id"] == sl.app_id
            assert p["event_id"].startswith("Ev") and abs(p["event_time"] - time.time()) < 5
            assert p["event"].items() >= {"type": "message", "channel": "D0001", "user": "U0001", "text": "hello bot",
                                          "channel_type": "im"}.items()
            # not acked within ack_timeout: the same event again, a new envelope, retry_attempt 1
            again = await frame(ws, 1)
            assert again["payload"] == p and again["envelope_id"] != first["envelope_id"]
            assert (again["retry_attempt"], again["retry_reason"]) == (1, "timeout")
            await ws.send_json({"envelope_id": again["envelope_id"]})
            await ws.send_json({"envelope_id": first["envelope_id"]})  # a late ack of the first attempt
            acks = await sl.wait_for("acks", 2)
            assert [(a["attempt"], a["duplicate"], a["event_id"]) for a in acks] == [
                (1, False, p["event_id"]), (0, True, p["event_id"])]
            assert sl.pending() == []
            with pytest.raises(asyncio.TimeoutError):
                await frame(ws, 0.5)  # acked: no more attempts

            # an app_mention never acked: max_retries redeliveries, then it expires
            mention = sl.app_mention("C0001", "U0001", "help", thread_ts="1700000000.000001")
            assert mention["payload"]["event"]["text"] == f"<@{sl.bot_user_id}> help"
            attempts = [(await frame(ws, 1))["retry_attempt"] for _ in range(3)]
            assert attempts == [0, 1, 2]
            expired = await sl.wait_for("expired", 1)
            assert expired[0]["event_id"] == mention["payload"]["event_id"]
            # interactive envelopes want an ack too but are not retried
            click = sl.block_actions("C0001", "U0001", "approve", "req-1", message_ts="1700000000.000001")
            got = await frame(ws)
            assert got["type"] == "interactive" and got["accepts_response_payload"] is True
            assert "retry_attempt" not in got and got["payload"]["actions"][0]["value"] == "req-1"
            assert got["payload"]["container"]["message_ts"] == "1700000000.000001"
            cmd = sl.slash_command("C0001", "U0001", "/status")
            got = await frame(ws)
            assert got["envelope_id"] == cmd["envelope_id"] and got["payload"]["command"] == "/status"
            await ws.send_json({"envelope_id": cmd["envelope_id"], "payload": {"text": "ok"}})
            assert (await sl.wait_for("acks", envelope_id=cmd["envelope_id"]))[0]["payload"] == {"text": "ok"}
            await sl.wait_for("expired", 2)
            assert click["envelope_id"] in [e["delivery"] for e in sl.records("expired")]
            await ws.send_str("not json")
            assert (await sl.wait_for("frames"))[0]["frame"] == "not json"
            await ws.close()
            for _ in range(100):
                if sl.connections()[0]["closed"] is not None:
                    break
                await asyncio.sleep(0.01)
            assert sl.connections()[0]["code"] == 1000

    run(go())


def test_connections_round_robin_disconnect_frames_and_waiting_envelopes() -> None:
    async def go() -> None:
        async with FakeSlack(ack_timeout=5) as sl, aiohttp.ClientSession() as s:
            ws1, ws2 = await connect(s, sl), await connect(s, sl)
            envs = [sl.message("D0001", "U0001", f"m{i}") for i in range(4)]
            got1 = [await frame(ws1) for _ in range(2)]
            got2 = [await frame(ws2) for _ in range(2)]
            assert sorted(e["envelope_id"] for e in got1 + got2) == sorted(e["envelope_id"] for e in envs)
            for ws, got in ((ws1, got1), (ws2, got2)):
                for e in got:
                    await ws.send_json({"envelope_id": e["envelope_id"]})
            await sl.wait_for("acks", 4)
            c1, c2 = (c["conn"] for c in sl.connections())
            # refresh_requested: that socket gets no more envelopes; the other one gets them all
            assert sl.disconnect("refresh_requested", conn=c1) == [c1]
            assert (await frame(ws1))["reason"] == "refresh_requested"
            more = [sl.message("D0001", "U0001", f"n{i}") for i in range(2)]
            assert [(await frame(ws2))["envelope_id"] for _ in more] == [e["envelope_id"] for e in more]
            # link_disabled closes the socket after the frame
            sl.disconnect("link_disabled", conn=c1)
            assert (await frame(ws1))["type"] == "disconnect"
            assert (await ws1.receive(timeout=2)).type in (WS.CLOSE, WS.CLOSED, WS.CLOSING)
            # with no connection, envelopes wait; the next connection gets them after its hello
            sl.drop(conn=c2)
            assert (await ws2.receive(timeout=2)).type in (WS.CLOSE, WS.CLOSED, WS.ERROR)
            await asyncio.sleep(0.05)
            waiting = sl.message("D0001", "U0001", "while away")
            assert [p["envelope_id"] for p in sl.pending()][-1] == waiting["envelope_id"]
            ws3 = await connect(s, sl)
            assert (await frame(ws3))["envelope_id"] == waiting["envelope_id"]  # ws2's unacked two: after ack_timeout
            assert {c["conn"]: c["disconnects"] for c in sl.connections()}[c1] == ["refresh_requested", "link_disabled"]
            assert [c["closed"] is None for c in sl.connections()] == [False, False, True]
            await ws3.close()

    run(go())


def test_silent_drop_answers_no_pings_and_keeps_the_socket_open() -> None:
    async def go() -> None:
        async with FakeSlack(ack_timeout=5) as sl, aiohttp.ClientSession() as s:
            ws = await connect(s, sl, autoping=False)
            await ws.ping(b"1")
            assert (await ws.receive(timeout=1)).type == WS.PONG
            [cid] = sl.silence()
            await ws.ping(b"2")
            with pytest.raises(asyncio.TimeoutError):
                await ws.receive(timeout=0.5)  # no pong, no close: only the client's own pings can tell
            env = sl.message("D0001", "U0001", "after the drop")
            assert not ws.closed and sl.pending()[0]["sent"] is False  # nothing goes down a dead socket
            ws2 = await connect(s, sl)
            assert (await frame(ws2))["envelope_id"] == env["envelope_id"]
            [c1, c2] = sl.connections()
            assert (c1["conn"], c1["silent"], c1["closed"], c1["pings"]) == (cid, True, None, 2)
            # a client with a heartbeat notices by itself
            ws3 = await connect(s, sl, heartbeat=0.2)
            sl.silence(conn=sl.connections()[-1]["conn"])
            msg = await ws3.receive(timeout=3)
            assert msg.type in (WS.CLOSED, WS.CLOSING, WS.ERROR, WS.CLOSE)
            sl.drop(conn=cid)  # a half-open socket ends when the TCP connection does
            assert (await ws.receive(timeout=1)).type in (WS.CLOSED, WS.ERROR)
            await ws.close()
            await ws2.close()

    run(go())


def test_two_apps_connection_limit_echo_and_restart() -> None:
    async def go() -> None:
        sl = FakeSlack([{}, {"team_id": "T0OTHER"}], ack_timeout=5)
        async with sl, aiohttp.ClientSession() as s:
            app2 = {"Authorization": "Bearer " + "xoxb-2000-2111-FakeSlackBotToken"}
            async with s.post(f"{sl.api_base}/auth.test", headers=app2) as r:
                assert (await r.json())["team_id"] == "T0OTHER"
            ws2 = await connect(s, sl, token="xapp-1-A0FAKE002-2222-FakeAppToken")
            ws1 = await connect(s, sl)
            env = sl.message("D0002", "U0002", "for app 2", app="T0OTHER")
            assert (await frame(ws2))["envelope_id"] == env["envelope_id"]
            assert env["payload"]["api_app_id"] == "A0FAKE002" and sl.pending() == []  # app 1 has nothing
            # Slack allows 10 connections per app: the 11th is told so and closed
            extra = [await connect(s, sl) for _ in range(9)]
            async with s.post(f"{sl.api_base}/apps.connections.open", data={},
                              headers={"Authorization": f"Bearer {DEFAULT_APP_TOKEN}"}) as r:
                url = (await r.json())["url"]
            async with s.ws_connect(url) as ws11:
                assert (await ws11.receive_json(timeout=2))["reason"] == "too_many_websockets"
                assert (await ws11.receive(timeout=2)).type in (WS.CLOSE, WS.CLOSED)
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:  # a ticket works once
                await s.ws_connect(url)
            assert e.value.status == 401
            for ws in extra:
                await ws.close()
            # echo_bot_messages: the bot's own post comes back as a message event with bot_id
            sl.configure(echo_bot_messages=True)
            sl.add_channel("C0001")
            await ok(s, sl, "chat.postMessage", channel="C0001", text="mine")
            got = await frame(ws1)
            echo = got["payload"]["event"]
            assert (echo["bot_id"], echo["user"], echo["text"]) == (sl.bot_id, sl.bot_user_id, "mine")
            await ws1.send_json({"envelope_id": got["envelope_id"]})
            await sl.wait_for("acks", envelope_id=got["envelope_id"])
            # close() on a silenced socket drops it
            [cid] = sl.silence(conn=sl.connections(app=sl.app_id)[0]["conn"])
            sl.close(conn=cid)
            assert (await ws1.receive(timeout=2)).type in (WS.CLOSED, WS.ERROR)
            await ws1.close()
            await ws2.close()
            # an unacked envelope survives a stop and start of the fake
            waiting = sl.message("D0001", "U0001", "across a restart")
        await sl.start()
        try:
            async with aiohttp.ClientSession() as s:
                ws = await connect(s, sl)
                assert (await frame(ws))["envelope_id"] == waiting["envelope_id"]
                await ws.close()
        finally:
            await sl.stop()

    run(go())


class _Receiver(BaseHTTPRequestHandler):
    """A minimal Events API endpoint: Slack's reference signature check, then url_verification or 200."""

    secret = DEFAULT_SIGNING_SECRET
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        ts, sig = self.headers.get("X-Slack-Request-Timestamp", ""), self.headers.get("X-Slack-Signature", "")
        expected = "v0=" + hmac.new(self.secret.encode(), f"v0:{ts}:".encode() + body, hashlib.sha256).hexdigest()
        fresh = ts.isdigit() and abs(time.time() - int(ts)) <= 300
        good = fresh and hmac.compare_digest(expected, sig)
        self.seen.append({"good": good, "retry": self.headers.get("X-Slack-Retry-Num"),
                          "reason": self.headers.get("X-Slack-Retry-Reason"), "ctype": self.headers["Content-Type"]})
        try:
            payload = json.loads(body) if good and self.headers["Content-Type"] == "application/json" else {}
        except ValueError:
            payload = {}
        out = json.dumps({"challenge": payload["challenge"]} if payload.get("type") == "url_verification" else {})
        self.send_response(200 if good else 401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(out.encode())

    def log_message(self, *args: Any) -> None:
        pass


def test_post_event_signs_requests_the_reference_check_accepts() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/slack/events"
    try:
        sl = FakeSlack()  # builders work without a running server
        env = sl.message("D0001", "U0001", "hi", deliver=False)
        r = post_event(url, env, DEFAULT_SIGNING_SECRET)  # an envelope: its payload is what is posted
        assert r.status == 200 and r.json == {} and 0 < r.elapsed < 5
        assert post_event(url, env["payload"], DEFAULT_SIGNING_SECRET, wrong_signature=True).status == 401
        assert post_event(url, env, DEFAULT_SIGNING_SECRET, timestamp=time.time() - 600).status == 401
        assert post_event(url, env, DEFAULT_SIGNING_SECRET, unsigned=True).status == 401
        assert post_event(url, env, "another-secret").status == 401
        assert post_event(url, env, DEFAULT_SIGNING_SECRET, retry_num=2).status == 200
        challenge = url_verification()
        assert post_event(url, challenge, DEFAULT_SIGNING_SECRET).json == {"challenge": challenge["challenge"]}
        assert post_event(url, {"payload": {"type": "block_actions"}}, DEFAULT_SIGNING_SECRET, form=True).status == 200
        assert post_event(url, b"{not json", DEFAULT_SIGNING_SECRET).status == 200  # raw bytes, signed as sent
        seen = _Receiver.seen
        assert [x["good"] for x in seen] == [True, False, False, False, False, True, True, True, True]
        assert (seen[5]["retry"], seen[5]["reason"]) == ("2", "http_timeout") and seen[0]["retry"] is None
        assert seen[7]["ctype"] == "application/x-www-form-urlencoded"
        assert post_event("http://127.0.0.1:1/", env, DEFAULT_SIGNING_SECRET, timeout=1).status == 0
    finally:
        server.shutdown()
        server.server_close()


def test_process_mode(tmp_path: Path) -> None:
    with FakeSlackProcess(tmp_path / "sl", ack_timeout=0.5) as sl:
        assert (tmp_path / "sl" / "fake_slack.port").read_text().strip() == str(sl.port)

        def api(method: str, token: str = sl.bot_token, **params: Any) -> tuple[int, dict[str, Any], Any]:
            req = urllib.request.Request(f"{sl.api_base}/{method}", data=json.dumps(params).encode(), method="POST",
                                         headers={"Content-Type": "application/json",
                                                  "Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return r.status, json.loads(r.read()), r.headers
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read()), e.headers

        assert api("auth.test")[1]["user_id"] == sl.bot_user_id
        sl.add_channel("C0042")
        sl.script_error("chat.postMessage", "ratelimited", retry_after=3)
        status, body, headers = api("chat.postMessage", channel="C0042", text="hi")
        assert (status, body["error"], headers["Retry-After"]) == (429, "ratelimited", "3")
        assert api("chat.postMessage", channel="C0042", text="hi")[1]["ok"] is True
        assert [p["text"] for p in sl.posted("C0042")] == ["hi"]
        assert sl.requests("chat.postMessage", status=429)[0]["error"] == "ratelimited"
        url = api("apps.connections.open", token=sl.app_token)[1]["url"]
        env = sl.message("D0001", "U0001", "over the socket", files=[("a.txt", b"abc")])

        async def client() -> dict[str, Any]:
            async with aiohttp.ClientSession() as s, s.ws_connect(url) as ws:
                assert (await ws.receive_json(timeout=2))["type"] == "hello"
                got = await ws.receive_json(timeout=2)
                await ws.send_json({"envelope_id": got["envelope_id"]})
                await asyncio.sleep(0.1)
                return got

        got = asyncio.run(client())
        assert got["envelope_id"] == env["envelope_id"] and got["payload"]["event"]["files"][0]["name"] == "a.txt"
        assert sl.wait_for("acks")[0]["envelope_id"] == env["envelope_id"] and sl.pending() == []
        with pytest.raises(ValueError):
            sl.disconnect("no-such-reason")
        proc = sl.proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
