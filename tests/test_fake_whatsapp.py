"""The fake WhatsApp Cloud API (tests/fake_whatsapp.py) behaves like the parts of the real one the gateway uses."""

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
from aiohttp import web

from tests.fake_whatsapp import (
    DEFAULT_TOKEN,
    FakeWhatsApp,
    FakeWhatsAppProcess,
    message_payload,
    post_webhook,
    verify_webhook,
    wamid_of,
)

SECRET = "test-app-secret"
VERIFY = "test-verify-token"
ALICE, BOB = "16505551234", "447700900123"


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 10))


def valid(raw: bytes, header: str | None, secret: str = SECRET) -> bool:
    """The check a gateway makes, computed here independently of the fake."""
    expected = "sha256=" + hmac.new(secret.encode(), raw, hashlib.sha256).hexdigest()
    return header is not None and hmac.compare_digest(expected, header)


async def graph(s: aiohttp.ClientSession, wa: FakeWhatsApp, method: str, path: str, body: Any = None,
                token: str | None = DEFAULT_TOKEN, **kw: Any) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with s.request(method, f"{wa.api_base}/{path}", json=body, headers=headers, **kw) as r:
        return r.status, await r.json()


async def send(s: aiohttp.ClientSession, wa: FakeWhatsApp, to: str, text: str, **extra: Any) -> tuple[int, Any]:
    body = {"messaging_product": "whatsapp", "recipient_type": "individual", "to": to, "type": "text",
            "text": {"body": text}, **extra}
    return await graph(s, wa, "POST", f"{wa.phone_number_id}/messages", body)


class Receiver:
    """A gateway stand-in: verifies signatures and the GET handshake; answers from `answers`, then 200."""

    def __init__(self) -> None:
        self.hits: list[dict[str, Any]] = []
        self.answers: list[int] = []

    async def post(self, request: web.Request) -> web.Response:
        raw = await request.read()
        ok = valid(raw, request.headers.get("X-Hub-Signature-256"))
        self.hits.append({"raw": raw, "valid": ok, "body": json.loads(raw) if ok else None})
        if not ok:
            return web.Response(status=401)
        return web.Response(status=self.answers.pop(0) if self.answers else 200)

    async def get(self, request: web.Request) -> web.Response:
        q = request.query
        if q.get("hub.mode") == "subscribe" and q.get("hub.verify_token") == VERIFY:
            return web.Response(text=q["hub.challenge"])
        return web.Response(status=403)

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.add_routes([web.post("/hook", self.post), web.get("/hook", self.get)])
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def test_auth_and_unknown_objects() -> None:
    async def go() -> None:
        async with FakeWhatsApp() as wa, aiohttp.ClientSession() as s:
            wa.open_window(ALICE)
            path = f"{wa.phone_number_id}/messages"
            msg = {"messaging_product": "whatsapp", "to": ALICE, "type": "text", "text": {"body": "hi"}}
            status, body = await graph(s, wa, "POST", path, msg, token="EAAwrong")
            assert status == 401 and body["error"]["code"] == 190 and body["error"]["type"] == "OAuthException"
            assert body["error"]["message"] == "Invalid OAuth access token - Cannot parse access token"
            assert body["error"]["fbtrace_id"]
            status, body = await graph(s, wa, "POST", path, msg, token=None)
            assert (status, body["error"]["code"]) == (400, 2500)
            async with s.post(f"{wa.api_base}/{path}?access_token={DEFAULT_TOKEN}", json=msg) as r:
                assert r.status == 200
            status, body = await graph(s, wa, "POST", "999/messages", msg)
            assert (status, body["error"]["code"], body["error"]["error_subcode"]) == (400, 100, 33)
            assert body["error"]["message"].startswith("Unsupported post request. Object with ID '999'")
            status, body = await graph(s, wa, "GET", "123456")
            assert (status, body["error"]["code"]) == (400, 100)
            assert [(r["status"], r.get("code")) for r in wa.records("requests")] == [
                (401, 190), (400, 2500), (200, None), (400, 100), (400, 100)]
            assert DEFAULT_TOKEN not in json.dumps(wa.records("requests"))

    run(go())


def test_send_text_recorded_and_validated() -> None:
    async def go() -> None:
        async with FakeWhatsApp() as wa, aiohttp.ClientSession() as s:
            inbound = wamid_of(wa.message(ALICE, "question", name="Alice"))
            t0 = time.time()
            status, body = await send(s, wa, "+1 650-555-1234", "answer", context={"message_id": inbound})
            assert status == 200
            assert body["messaging_product"] == "whatsapp"
            assert body["contacts"] == [{"input": "+1 650-555-1234", "wa_id": ALICE}]
            assert body["messages"][0]["id"].startswith("wamid.")
            [rec] = wa.sent(to=ALICE)
            assert (rec["id"], rec["type"], rec["text"], rec["context"]) == (
                body["messages"][0]["id"], "text", "answer", inbound)
            assert t0 <= rec["ts"] <= time.time()
            # 4096 characters fit, 4097 do not; an empty body, a missing messaging_product are 100
            assert (await send(s, wa, ALICE, "é" * 4096))[0] == 200
            status, body = await send(s, wa, ALICE, "x" * 4097)
            assert (status, body["error"]["code"]) == (400, 100)
            assert "4096" in body["error"]["error_data"]["details"]
            assert (await send(s, wa, ALICE, ""))[1]["error"]["code"] == 100
            status, body = await graph(s, wa, "POST", f"{wa.phone_number_id}/messages",
                                       {"to": ALICE, "type": "text", "text": {"body": "x"}})
            assert body["error"]["message"] == "(#100) The parameter messaging_product is required."
            assert len(wa.sent()) == 2 and wa.sent(since=time.time() + 1) == []
            # read receipt with a typing indicator; an unknown message id is refused
            read = {"messaging_product": "whatsapp", "status": "read", "message_id": inbound,
                    "typing_indicator": {"type": "text"}}
            assert await graph(s, wa, "POST", f"{wa.phone_number_id}/messages", read) == (200, {"success": True})
            status, body = await graph(s, wa, "POST", f"{wa.phone_number_id}/messages",
                                       {**read, "message_id": "wamid.nope"})
            assert (status, body["error"]["code"]) == (400, 100)
            assert [(r["message_id"], r["wa_id"], r["typing"]) for r in wa.records("reads")] == [(inbound, ALICE, True)]
            # a template goes; a configured list of templates refuses others with 132001
            tpl = {"messaging_product": "whatsapp", "to": BOB, "type": "template",
                   "template": {"name": "hello_world", "language": {"code": "en_US"}}}
            status, body = await graph(s, wa, "POST", f"{wa.phone_number_id}/messages", tpl)
            assert status == 200 and body["messages"][0]["message_status"] == "accepted"
            assert wa.sent(to=BOB)[0]["template"] == "hello_world"
            wa.configure(templates=["reengage"])
            status, body = await graph(s, wa, "POST", f"{wa.phone_number_id}/messages", tpl)
            assert (status, body["error"]["code"]) == (404, 132001)

    run(go())


def test_customer_service_window() -> None:
    async def go() -> None:
        async with FakeWhatsApp() as wa, aiohttp.ClientSession() as s:
            # never wrote: 131047, in Meta's envelope
            status, body = await send(s, wa, BOB, "hello?")
            assert status == 400
            err = body["error"]
            assert (err["code"], err["type"]) == (131047, "OAuthException")
            assert err["message"] == "(#131047) Re-engagement message"
            assert "24 hours" in err["error_data"]["details"] and err["error_data"]["messaging_product"] == "whatsapp"
            wa.message(BOB, "hi")
            assert (await send(s, wa, BOB, "inside"))[0] == 200
            assert wa.age_window(BOB)["open"] is False
            assert (await send(s, wa, BOB, "outside"))[1]["error"]["code"] == 131047
            tpl = {"messaging_product": "whatsapp", "to": BOB, "type": "template",
                   "template": {"name": "reengage", "language": {"code": "en"}}}
            assert (await graph(s, wa, "POST", f"{wa.phone_number_id}/messages", tpl))[0] == 200
            # a message whose timestamp is 25 h old does not open it; a fresh one does; age by a few seconds
            wa.message(ALICE, "old", timestamp=time.time() - 25 * 3600)
            assert wa.window(ALICE)["open"] is False
            wa.open_window(ALICE)
            assert wa.age_window(ALICE, 60)["open"] is True
            assert (await send(s, wa, ALICE, "still open"))[0] == 200
            wa.close_window(ALICE)
            assert wa.window(ALICE)["last_inbound"] is None
            assert [x["text"] for x in wa.sent()] == ["inside", None, "still open"]

    run(go())


def test_scripted_errors_and_rate_limits() -> None:
    async def go() -> None:
        async with FakeWhatsApp() as wa, aiohttp.ClientSession() as s:
            wa.open_window(ALICE)
            wa.open_window(BOB)
            wa.script_error(130429, times=2)
            for _ in range(2):
                status, body = await send(s, wa, ALICE, "x")
                assert (status, body["error"]["code"], body["error"]["message"]) == (
                    400, 130429, "(#130429) Rate limit hit")
            assert (await send(s, wa, ALICE, "x"))[0] == 200
            # per recipient: only BOB's send fails
            wa.script_error(131056, to="+44 7700 900123")
            assert (await send(s, wa, ALICE, "fine"))[0] == 200
            status, body = await send(s, wa, BOB, "x")
            assert (status, body["error"]["code"]) == (400, 131056)
            assert "pair rate limit" in body["error"]["message"]
            for code, http in ((131026, 400), (100, 400), (500, 500)):
                wa.script_error(code)
                status, body = await send(s, wa, BOB, "x")
                assert status == http and body["error"]["code"] == (131000 if code == 500 else code)
            assert wa.scripted == []
            with pytest.raises(ValueError):
                wa.script_error(130429, on="nonsense")
            # lasting limits: the pair rate per recipient, the throughput per number
            wa.set_rate_limit(pair_interval=5.0)
            assert (await send(s, wa, BOB, "first"))[0] == 200
            assert (await send(s, wa, BOB, "too soon"))[1]["error"]["code"] == 131056
            wa.set_rate_limit(per_second=1)
            wa.open_window("15550000001")
            assert (await send(s, wa, "15550000001", "y"))[1]["error"]["code"] == 130429
            wa.set_rate_limit()
            assert (await send(s, wa, BOB, "limits off"))[0] == 200

    run(go())


def test_media_upload_download_and_expiry() -> None:
    async def go() -> None:
        async with FakeWhatsApp(media_ttl=0.3) as wa, aiohttp.ClientSession() as s:
            auth = {"Authorization": f"Bearer {wa.token}"}
            form = aiohttp.FormData()
            form.add_field("messaging_product", "whatsapp")
            form.add_field("type", "image/png")
            form.add_field("file", b"\x89PNG data", filename="chart.png", content_type="image/png")
            async with s.post(f"{wa.api_base}/{wa.phone_number_id}/media", data=form, headers=auth) as r:
                assert r.status == 200
                media_id = (await r.json())["id"]
            assert wa.records("uploads")[0]["size"] == 9 and wa.records("uploads")[0]["filename"] == "chart.png"
            status, info = await graph(s, wa, "GET", media_id)
            assert status == 200 and set(info) == {"messaging_product", "url", "mime_type", "sha256", "file_size", "id"}
            assert (info["id"], info["mime_type"], info["file_size"]) == (media_id, "image/png", 9)
            assert info["sha256"] == hashlib.sha256(b"\x89PNG data").hexdigest()
            async with s.get(info["url"]) as r:
                assert r.status == 401  # the CDN wants the bearer token too
            async with s.get(info["url"], headers=auth) as r:
                assert r.status == 200 and await r.read() == b"\x89PNG data"
            # send it by id, and by link; an unknown id is refused
            wa.open_window(ALICE)
            img = {"messaging_product": "whatsapp", "to": ALICE, "type": "image",
                   "image": {"id": media_id, "caption": "look"}}
            assert (await graph(s, wa, "POST", f"{wa.phone_number_id}/messages", img))[0] == 200
            doc = {"messaging_product": "whatsapp", "to": ALICE, "type": "document",
                   "document": {"link": "https://example.invalid/a.pdf", "filename": "a.pdf"}}
            assert (await graph(s, wa, "POST", f"{wa.phone_number_id}/messages", doc))[0] == 200
            audio = {"messaging_product": "whatsapp", "to": ALICE, "type": "audio", "audio": {"id": "404404"}}
            assert (await graph(s, wa, "POST", f"{wa.phone_number_id}/messages", audio))[1]["error"]["code"] == 100
            assert [(x["type"], x["media_id"], x["caption"]) for x in wa.sent()] == [
                ("image", media_id, "look"), ("document", None, None)]
            # URLs expire after media_ttl (404); a new GET gives a fresh one; expire_media_urls ends them at once
            await asyncio.sleep(0.35)
            async with s.get(info["url"], headers=auth) as r:
                assert r.status == 404
            assert wa.records("downloads", kind="content")[-1]["expired"] is True
            wa.configure(media_ttl=60)
            fresh = (await graph(s, wa, "GET", media_id))[1]["url"]
            assert fresh != info["url"]
            async with s.get(fresh, headers=auth) as r:
                assert r.status == 200
            wa.expire_media_urls(media_id)
            async with s.get(fresh, headers=auth) as r:
                assert r.status == 404
            # inbound media: the message carries an id the gateway can resolve and download
            p = wa.message(BOB, type="document", content=b"%PDF-1.4", mime_type="application/pdf",
                           filename="r.pdf", caption="report")
            doc_in = p["entry"][0]["changes"][0]["value"]["messages"][0]["document"]
            assert (doc_in["filename"], doc_in["caption"]) == ("r.pdf", "report")
            assert doc_in["mime_type"] == "application/pdf" and doc_in["sha256"]
            got = (await graph(s, wa, "GET", doc_in["id"]))[1]
            async with s.get(got["url"], headers=auth) as r:
                assert await r.read() == b"%PDF-1.4"
            # upload errors: no messaging_product; an image over 5 MB
            form = aiohttp.FormData()
            form.add_field("type", "image/jpeg")
            form.add_field("file", b"x", filename="x.jpg", content_type="image/jpeg")
            async with s.post(f"{wa.api_base}/{wa.phone_number_id}/media", data=form, headers=auth) as r:
                assert r.status == 400 and (await r.json())["error"]["code"] == 100
            form = aiohttp.FormData()
            form.add_field("messaging_product", "whatsapp")
            form.add_field("type", "image/jpeg")
            form.add_field("file", b"x" * (5 * 1024 * 1024 + 1), filename="big.jpg", content_type="image/jpeg")
            async with s.post(f"{wa.api_base}/{wa.phone_number_id}/media", data=form, headers=auth) as r:
                assert r.status == 400 and (await r.json())["error"]["code"] == 131053

    run(go())


def test_webhook_signing_retry_duplicates_and_verify() -> None:
    async def go() -> None:
        async with Receiver() as rx, FakeWhatsApp(webhook_backoff=(0.02, 0.1)) as wa:
            wa.subscribe(rx.url, SECRET)
            # non-ASCII text: the raw body escapes it, and the signature covers those raw bytes
            rx.answers = [500, 503]
            p = wa.message(ALICE, "café ☕", name="Zoë", context_id="wamid.prev")
            await wa.drain()
            assert [h["valid"] for h in rx.hits] == [True, True, True]
            assert b"caf\\u00e9 \\u2615" in rx.hits[0]["raw"] and b"\xc3" not in rx.hits[0]["raw"]
            body = rx.hits[-1]["body"]
            assert body == p and body["object"] == "whatsapp_business_account"
            value = body["entry"][0]["changes"][0]["value"]
            assert value["metadata"] == {"display_phone_number": "15550783881", "phone_number_id": wa.phone_number_id}
            assert value["contacts"] == [{"profile": {"name": "Zoë"}, "wa_id": ALICE}]
            msg = value["messages"][0]
            assert (msg["from"], msg["type"], msg["text"], msg["context"]["id"]) == (
                ALICE, "text", {"body": "café ☕"}, "wamid.prev")
            assert [(d["attempt"], d["status"]) for d in wa.deliveries()] == [(1, 500), (2, 503), (3, 200)]
            # wrongly signed and unsigned posts are refused by the receiver, tried once; duplicates are identical
            wrong = await wa.deliver(payload=message_payload(BOB, "forged"), wrong_signature=True)
            unsigned = await wa.deliver(payload=message_payload(BOB, "unsigned"), unsigned=True)
            assert [(d["status"], d["signature"]) for d in wrong + unsigned] == [(401, "wrong"), (401, "none")]
            rx.hits.clear()
            dup = await wa.deliver(payload=message_payload(BOB, "again", wamid="wamid.dup"), duplicate=2)
            assert [(d["copy"], d["status"], d["wamids"]) for d in dup] == [(c, 200, ["wamid.dup"]) for c in range(3)]
            assert len({h["raw"] for h in rx.hits}) == 1 and all(h["valid"] for h in rx.hits)
            # raw bytes go as they are (malformed payloads), signed
            raw = await wa.deliver(payload=b"{not json", app_secret="other", attempts=1)
            assert [(d["kind"], d["status"]) for d in raw] == [("raw", 401)]
            # the GET handshake
            ok = await wa.verify(verify_token=VERIFY, challenge="1158201444")
            assert (ok["status"], ok["body"]) == (200, "1158201444")
            assert (await wa.verify(verify_token="wrong"))["status"] == 403
            # queued deliveries, several at once
            wa.configure(webhook_concurrency=4)
            rx.hits.clear()
            for i in range(8):
                assert await wa.deliver(payload=message_payload(BOB, f"q{i}"), wait=False) == []
            assert 0 < wa.pending() <= 8
            assert (await wa.drain())["pending"] == 0
            assert sorted(h["body"]["entry"][0]["changes"][0]["value"]["messages"][0]["text"]["body"]
                          for h in rx.hits) == [f"q{i}" for i in range(8)]

    run(go())


def test_statuses_out_of_order_auto_and_async_window_failure() -> None:
    async def go() -> None:
        async with Receiver() as rx, FakeWhatsApp() as wa, aiohttp.ClientSession() as s:
            wa.subscribe(rx.url, SECRET, auto_statuses=("sent", "delivered"))
            wa.message(ALICE, "hi")
            status, body = await send(s, wa, ALICE, "hello")
            wamid = body["messages"][0]["id"]
            await wa.drain()
            kinds = [(d["kind"], d["statuses"]) for d in wa.deliveries()]
            assert kinds == [("messages", []), ("statuses", ["sent"]), ("statuses", ["delivered"])]
            rx.hits.clear()
            # any order, some skipped, repeated, or batched
            wa.statuses(wamid, ["sent", "delivered", "read"], order="reverse")
            wa.statuses(wamid, ["sent", "delivered", "read"], order=[2, 0, 2])
            wa.statuses(wamid, ["delivered", "read"], batch=True)
            await wa.drain()
            got = [[st["status"] for st in h["body"]["entry"][0]["changes"][0]["value"]["statuses"]] for h in rx.hits]
            assert got == [["read"], ["delivered"], ["sent"], ["read"], ["sent"], ["read"], ["delivered", "read"]]
            st = rx.hits[0]["body"]["entry"][0]["changes"][0]["value"]["statuses"][0]
            assert (st["id"], st["recipient_id"]) == (wamid, ALICE) and st["timestamp"].isdigit()
            # failed with errors; the window failure reported by webhook instead of the send's answer
            failed = wa.statuses(wamid, ["failed"], errors=[131026], deliver=False)[0]
            err = failed["entry"][0]["changes"][0]["value"]["statuses"][0]["errors"][0]
            assert (err["code"], err["title"]) == (131026, "Message Undeliverable") and err["error_data"]["details"]
            wa.configure(window_errors="webhook")
            wa.subscribe(rx.url, SECRET)
            rx.hits.clear()
            status, body = await send(s, wa, BOB, "outside the window")
            assert status == 200
            await wa.drain()
            [hit] = rx.hits
            st = hit["body"]["entry"][0]["changes"][0]["value"]["statuses"][0]
            assert (st["id"], st["status"], st["errors"][0]["code"]) == (body["messages"][0]["id"], "failed", 131047)
            assert wa.sent(to=BOB)[0]["failed"] == 131047
            with pytest.raises(ValueError):
                wa.statuses("wamid.unknown", ["sent"])

    run(go())


class _SyncReceiver(BaseHTTPRequestHandler):
    hits: list[tuple[bool, dict[str, Any]]] = []

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        ok = valid(raw, self.headers.get("X-Hub-Signature-256"))
        self.hits.append((ok, json.loads(raw) if ok else None))
        self.send_response(200 if ok else 401)
        self.end_headers()

    def do_GET(self) -> None:
        q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        good = q.get("hub.verify_token") == [VERIFY]
        self.send_response(200 if good else 403)
        self.end_headers()
        if good:
            self.wfile.write(q["hub.challenge"][0].encode())

    def log_message(self, *args: Any) -> None:
        pass


def test_process_mode_and_sync_helpers(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SyncReceiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hook = f"http://127.0.0.1:{server.server_address[1]}/hook"
    _SyncReceiver.hits = []
    try:
        # the plain functions, no fake at all
        recs = post_webhook(hook, message_payload(ALICE, "direct"), SECRET, duplicate=1)
        assert [(r["copy"], r["status"]) for r in recs] == [(0, 200), (1, 200)]
        assert post_webhook(hook, message_payload(ALICE, "x"), SECRET, wrong_signature=True)[0]["status"] == 401
        assert verify_webhook(hook, VERIFY, "42")["body"] == "42"
        assert verify_webhook(hook, "nope")["status"] == 403
        with FakeWhatsAppProcess(tmp_path / "wa", webhook=hook, app_secret=SECRET) as wa:
            assert (tmp_path / "wa" / "fake_whatsapp.port").read_text().strip() == str(wa.port)
            _SyncReceiver.hits = []
            wamid = wa.message(BOB, "from the control endpoint")["wamid"]
            assert wa.drain()["pending"] == 0
            assert [(ok, wamid_of(body)) for ok, body in _SyncReceiver.hits] == [(True, wamid)]

            def send(to: str, text: str) -> tuple[int, dict[str, Any]]:
                req = urllib.request.Request(
                    f"{wa.api_base}/{wa.phone_number_id}/messages", method="POST",
                    data=json.dumps({"messaging_product": "whatsapp", "to": to, "type": "text",
                                     "text": {"body": text}}).encode(),
                    headers={"Content-Type": "application/json", "Authorization": f"Bearer {wa.token}"})
                try:
                    with urllib.request.urlopen(req, timeout=5) as r:
                        return r.status, json.loads(r.read())
                except urllib.error.HTTPError as e:
                    return e.code, json.loads(e.read())

            assert send(BOB, "reply")[0] == 200
            assert send(ALICE, "never wrote")[1]["error"]["code"] == 131047
            wa.script_error(130429, to=BOB)
            assert send(BOB, "limited")[1]["error"]["code"] == 130429
            assert send(BOB, "ok again")[0] == 200
            assert [x["text"] for x in wa.sent(to=BOB)] == ["reply", "ok again"]
            assert wa.age_window(BOB)["open"] is False and send(BOB, "late")[0] == 400
            media = wa.add_media(b"OggS", mime_type="audio/ogg")
            assert media["file_size"] == 4
            recs = wa.deliver(payload=b'{"object": "x"}', wrong_signature=True)
            assert [(r["kind"], r["status"], r["signature"]) for r in recs] == [("raw", 401, "wrong")]
            assert wa.verify(verify_token=VERIFY, challenge="7")["body"] == "7"
            assert len(wa.deliveries(kind="verify")) == 1
            wa.reset()
            assert wa.sent() == [] and wa.deliveries() == []
            proc = wa.proc
            assert proc is not None
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(5) == 0
    finally:
        server.shutdown()
        server.server_close()
