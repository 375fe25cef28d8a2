"""The WhatsApp Cloud API gateway against the fake Graph API (which also posts Meta's webhooks), with
the real writer, runner and gateway processes. One stack for the module; each test uses its own numbers.
"""

from __future__ import annotations

import json
import os
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from common import db
from common.stores import outbox_store
from schema import messages as m
from tests.fake_whatsapp import DEFAULT_APP_SECRET, DEFAULT_PHONE_NUMBER_ID, message_payload, sign
from tests.procs import wait_until
from tests.test_telegram_gateway import call
from tests.whatsapp_stack import OWNER, WhatsAppStack

ALLOWED = [OWNER] + [f"49151000{i:03d}" for i in range(100, 140)]
CAP_KB = 16


@pytest.fixture(scope="module")
def wa():
    gateway = (f'[[gateways.whatsapp]]\nid = "wa"\nphone_number_id = "{DEFAULT_PHONE_NUMBER_ID}"\n'
               'api_base = "{API}"\nlisten = "{LISTEN}"\n'
               f"allow = {json.dumps(['+' + a for a in ALLOWED])}\nmax_attachment_mb = {CAP_KB / 1024}\n"
               'template = "we_are_back"\n')
    s = WhatsAppStack(gateway=gateway)
    try:
        s.start_gateway()
        yield s
    finally:
        s.stop()


def number(i: int) -> str:
    return f"49151000{i:03d}"


def user_turns(s, chat: str) -> list[str]:
    return s.user_turns("wa", chat)


def outbox(s, chat: str) -> list[outbox_store.Row]:
    return s.outbox("wa", chat)


def settled(s, chat: str, timeout: float = 10.0) -> list[outbox_store.Row]:
    return s.settled("wa", chat, timeout)


def post_raw(url: str, body: bytes, signature: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def model_saw(s, text: str) -> bool:
    return s.model_saw(text)


def test_the_verification_handshake(wa):
    good = wa.wa.verify(wa.webhook, challenge="1158201444")
    bad = wa.wa.verify(wa.webhook, verify_token="not-the-token", challenge="1158201444")
    assert (200, "1158201444", 403) == (good["status"], good["body"], bad["status"])


def test_a_message_gets_its_reply_and_a_read_receipt(wa):
    sent = wa.wa.message(number(100), "hello **there**", name="Ana")
    [reply] = wa.replies(number(100), 1)
    assert "echo: hello *there*" == reply["text"]
    wait_until(lambda: any(r["message_id"] == sent["wamid"] for r in wa.wa.records("reads")), 5, what="read receipt")
    [row] = settled(wa, number(100))
    assert ("sent", reply["id"]) == (row.state, row.platform_msg_id)


def test_statuses_in_any_order_land_on_the_outbox_row(wa):
    wa.wa.message(number(101), "track me")
    [reply] = wa.replies(number(101), 1)
    settled(wa, number(101))
    wa.wa.statuses(reply["id"], ["read", "sent", "delivered"])
    wait_until(lambda: outbox(wa, number(101))[0].error == "" and _delivery(wa, reply["id"]) == "read", 10,
               what="the read status")
    wa.wa.statuses(reply["id"], ["failed"], errors=[131026])
    time.sleep(0.5)
    assert "read" == _delivery(wa, reply["id"])  # a late failure does not undo a read


def _delivery(s, wamid: str) -> str:
    conn = s.reader()
    with db.read_tx(conn):
        found = outbox_store.delivery_of(conn, "wa", wamid)
    return found[0] if found else ""


def test_a_forged_or_unsigned_post_stores_nothing(wa):
    payload = message_payload(number(102), "forged words", phone_number_id=DEFAULT_PHONE_NUMBER_ID)
    body = json.dumps(payload).encode()
    assert 401 == post_raw(wa.webhook, body, None)
    assert 401 == post_raw(wa.webhook, body, "sha256=" + "0" * 64)
    assert 401 == post_raw(wa.webhook, body, sign(body, "another-app-secret"))
    assert [] == user_turns(wa, number(102))
    assert 200 == post_raw(wa.webhook, body, sign(body, DEFAULT_APP_SECRET))
    assert ["forged words"] == user_turns(wa, number(102))  # stored before the 200
    assert 200 == post_raw(wa.webhook, body, sign(body, DEFAULT_APP_SECRET))  # Meta's redelivery
    assert 1 == len(user_turns(wa, number(102)))


def test_a_stranger_gets_a_pairing_code_and_never_reaches_the_model(wa):
    wa.wa.message("4477000900", "stranger secrets")
    [notice] = wa.replies("4477000900", 1)
    assert "starling pairing approve" in notice["text"]
    time.sleep(0.5)
    assert not model_saw(wa, "stranger secrets")


def test_an_image_is_fetched_by_id_and_a_big_file_is_not(wa):
    content = os.urandom(3000)
    wa.wa.message(number(103), type="image", content=content, caption="look", mime_type="image/jpeg")
    wa.replies(number(103), 1)  # one at a time: two at once may be answered together (the collect queue)
    wa.wa.message(number(103), type="document", content=os.urandom((CAP_KB + 4) * 1024), filename="big.pdf")
    wa.replies(number(103), 2)
    first, second = user_turns(wa, number(103))
    assert first.startswith("look\n[image attached: ") and second.startswith("[document not saved: ")
    saved = Path(first.split("[image attached: ")[1].split(" (")[0])
    assert content == saved.read_bytes() and 0o600 == stat.S_IMODE(saved.stat().st_mode)


def test_outside_the_24_hour_window_the_template_goes_instead(wa):
    wa.wa.message(number(104), "hi")
    wa.replies(number(104), 1)
    wa.wa.age_window(number(104))
    call(wa, m.EnqueueOutbox(instance="wa", chat=number(104), replies=[m.Reply(text="a late answer")]))
    rows = settled(wa, number(104))
    assert "failed" == rows[-1].state and "131047" in rows[-1].error and "we_are_back" in rows[-1].error
    assert "we_are_back" == wa.wa.sent(to=number(104))[-1]["template"]


def test_rate_limits_back_off_and_other_errors_are_not_retried(wa):
    wa.wa.message(number(105), "one")
    wa.replies(number(105), 1)
    wa.wa.script_error(131056, to=number(105))
    t0 = time.time()
    call(wa, m.EnqueueOutbox(instance="wa", chat=number(105), replies=[m.Reply(text="after the pair limit")]))
    [_, again] = wa.replies(number(105), 2, timeout=30)
    assert again["ts"] - t0 >= 5.5
    wa.wa.script_error(131026, to=number(105))
    call(wa, m.EnqueueOutbox(instance="wa", chat=number(105), replies=[m.Reply(text="undeliverable")]))
    rows = settled(wa, number(105))
    assert ("failed", 1) == (rows[-1].state, rows[-1].attempts) and "undeliverable" in rows[-1].error


def test_a_long_answer_and_a_file_from_the_agent(wa):
    wa.wa.message(number(106), "start")
    wa.replies(number(106), 1)
    report = wa.home.paths.shared_workspace / "report.pdf"
    report.write_bytes(os.urandom(900))
    long = "\n\n".join(f"paragraph {i} " + "word " * 100 for i in range(15))
    call(wa, m.EnqueueOutbox(instance="wa", chat=number(106), replies=[
        m.Reply(text=long), m.Reply(text="the report", file_path=str(report))]))
    rows = settled(wa, number(106))
    sent = wa.wa.sent(to=number(106))[1:]
    texts = [s["text"] for s in sent if s["type"] == "text"]
    assert len(texts) >= 2 and all(len(t) <= 4096 for t in texts)
    assert "".join(texts).replace("\n", "").replace(" ", "") == long.replace("\n", "").replace(" ", "")
    assert ("document", "the report", "report.pdf") == (sent[-1]["type"], sent[-1]["caption"], sent[-1]["filename"])
    assert all(r.state == "sent" for r in rows)


def test_garbage_and_unknown_types_are_skipped(wa):
    for raw in (b"{not json", json.dumps({"object": "page"}).encode(),
                json.dumps(message_payload(number(107), type="unsupported",
                                           phone_number_id=DEFAULT_PHONE_NUMBER_ID)).encode(),
                json.dumps({"object": "whatsapp_business_account", "entry": 5}).encode(),
                json.dumps({"object": "whatsapp_business_account", "entry": [{"changes": [
                    {"value": {"messages": 7, "statuses": "x", "contacts": 3}}]}]}).encode()):
        assert 200 == post_raw(wa.webhook, raw, sign(raw, DEFAULT_APP_SECRET))
    other = json.dumps(message_payload(number(107), "for another number", phone_number_id="999000")).encode()
    assert 200 == post_raw(wa.webhook, other, sign(other, DEFAULT_APP_SECRET))
    wa.wa.message(number(107), "still fine")
    assert "echo: still fine" == wa.replies(number(107), 1)[0]["text"]
    assert wa.gateway.alive() and "event_skipped" in wa.gateway.log_text()
    assert "event_for_another_number" in wa.gateway.log_text() and ["still fine"] == user_turns(wa, number(107))
