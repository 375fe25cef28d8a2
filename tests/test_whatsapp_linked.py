"""Linked-device mode without the network: the link state machine and reconnect policy, the mapping of
messages and send errors, the transport driving a fake client (tests/fake_linked.py) behind the same
interface as neonize, and linking and unlinking as the CLI does them."""

from __future__ import annotations

import asyncio
import random
import time
from types import SimpleNamespace

import pytest

from schema import messages as m
from services.gateway.channel import Failed, InboundMessage, Retry, Sent
from services.gateway.whatsapp import linked, linking
from services.gateway.whatsapp.linked import (
    Backoff, Link, LinkedMessage, LinkRecord, LogoutReason, SendError, SendKind, Skip, State
)
from services.gateway.whatsapp.linked_transport import UNLINK_REQUEST, LinkedTransport
from services.gateway.whatsapp.session_vault import SessionVault
from tests.fake_linked import ACCOUNT, NO_ACCOUNT, FakeClient

# ---------------------------------------------------------------- the state machine


def test_the_link_goes_unlinked_linking_connecting_linked():
    seen = []
    link = Link("wa", on_change=lambda lk: seen.append(lk.state))
    link.to(State.LINKING)
    link.to(State.CONNECTING)
    link.account = ACCOUNT
    link.to(State.LINKED)
    assert [State.LINKING, State.CONNECTING, State.LINKED] == seen
    assert f"linked as +{ACCOUNT}" == link.status()


def test_a_change_the_machine_does_not_know_is_refused():
    link = Link("wa")
    with pytest.raises(ValueError):
        link.to(State.LINKED)  # unlinked cannot be linked without connecting
    link.to(State.CONNECTING)
    link.to(State.LOGGED_OUT, LogoutReason.DEVICE_REMOVED.value)
    with pytest.raises(ValueError):
        link.to(State.LINKED)  # a logged-out session never comes back by itself


def test_the_status_line_says_why_and_what_next():
    link = Link("wa")
    assert "run `starling whatsapp link wa`" in link.status()
    link.to(State.CONNECTING, "connection reset", attempt=3, next_at=time.time() + 8)
    at = time.strftime("%H:%M:%S", time.localtime(link.next_at))
    assert f"attempt 4 at {at}" in link.status() and "connection reset" in link.status()
    link.to(State.LOGGED_OUT, LogoutReason.REPLACED.value)
    assert "another client took over" in link.status() and "not reconnecting" in link.status()


def test_the_backoff_doubles_with_jitter_and_is_capped():
    backoff = Backoff(first_s=1.0, cap_s=60.0, jitter=0.25, rng=random.Random(7))
    delays = [backoff.delay(n) for n in range(1, 40)]
    assert all(0.75 * min(60.0, 2 ** (n - 1)) <= d <= min(60.0, 2 ** (n - 1)) for n, d in enumerate(delays, 1))
    assert max(delays) <= 60.0
    assert all(45.0 <= d for d in delays[8:])  # capped: never less than cap × (1 − jitter) either
    assert len(set(delays[8:])) > 1  # jittered: gateways that dropped together do not return in step


# ---------------------------------------------------------------- mapping


def test_a_private_text_becomes_an_inbound_message():
    msg = LinkedMessage(id="3EB0AA", chat="4915112345678", sender="4915112345678", text="hi", sender_name="Ann",
                        reply_to="3EB0PREV")
    inbound = linked.to_inbound(msg, "wa")
    assert isinstance(inbound, InboundMessage)
    assert (["wa:wa:lm:4915112345678:3EB0AA"], "hi", True, "3EB0PREV", "Ann") == (
        inbound.dedupe_keys, inbound.text, inbound.private, inbound.reply_to, inbound.sender_name)
    assert inbound.dedupe_keys == linked.to_inbound(msg, "wa").dedupe_keys  # a redelivery is the same turn


def test_group_messages_and_files():
    group = LinkedMessage(id="X1", chat="120363025246125888@g.us", sender="4915112345678", text="@bot hello",
                          group=True, mentions_me=True)
    inbound = linked.to_inbound(group, "wa")
    assert (False, True, "120363025246125888@g.us") == (inbound.private, inbound.addressed, inbound.room)
    assert ["wa:wa:lm:120363025246125888@g.us:4915112345678:X1"] == inbound.dedupe_keys
    image = linked.to_inbound(LinkedMessage(id="X2", chat="49151", sender="49151", text="look", kind="image"), "wa")
    assert image.text.startswith("look\n[an image was sent") and "not fetched" in image.text


def test_what_is_not_a_message_for_the_agent_is_skipped():
    for msg in (LinkedMessage(id="a", chat="49151", sender="49151", text="mine", from_me=True),
                LinkedMessage(id="b", chat="status@broadcast", sender="49151", text="story"),
                LinkedMessage(id="", chat="49151", sender="49151", text="no id"),
                LinkedMessage(id="c", chat="49151", sender="49151", text="")):
        assert isinstance(linked.to_inbound(msg, "wa"), Skip)


def test_the_kit_takes_the_clients_events_and_fetches_the_files_it_has_a_handle_for():
    image = LinkedMessage(id="X3", chat="49151", sender="49151", text="look", kind="image", media="h1")
    parsed = linked.parse(linked.as_event(image), "wa")
    assert ("look", [("image", "h1", "image-X3")]) == (parsed.msg.text, [(f.kind, f.ref, f.name) for f in parsed.files])
    assert ["wa:wa:lm:49151:X3"] == parsed.msg.dedupe_keys  # the same key as without a file
    bare = linked.parse(linked.as_event(LinkedMessage(id="X4", chat="49151", sender="49151", kind="document",
                                                      file_name="a.pdf", media="h2")), "wa")
    assert ("", [("document", "h2", "a.pdf")]) == (bare.msg.text, [(f.kind, f.ref, f.name) for f in bare.files])
    described = linked.parse(linked.as_event(LinkedMessage(id="X5", chat="49151", sender="49151", kind="video")), "wa")
    assert [] == described.files and "not fetched" in described.msg.text  # no handle: described, as before
    for odd in ({"id": "X6", "chat": "49151", "sender": "49151", "surprise": 1}, "text", None):
        assert isinstance(linked.parse(odd, "wa"), Skip)
    assert isinstance(linked.parse(linked.as_event(LinkedMessage(id="X7", chat="49151", sender="49151", text="x",
                                                                 from_me=True)), "wa"), Skip)


def test_send_errors_map_to_outcomes():
    assert isinstance(linked.outcome(SendError(SendKind.NETWORK), 1), Retry)
    assert isinstance(linked.outcome(SendError(SendKind.NOT_CONNECTED), 1), Retry)
    assert 30.0 <= linked.outcome(SendError(SendKind.RATE_LIMITED, retry_after_s=30.0), 1).after_s
    assert linked.LOGGED_OUT_RETRY_S == linked.outcome(SendError(SendKind.LOGGED_OUT), 1).after_s
    for kind in (SendKind.NO_ACCOUNT, SendKind.TOO_LARGE, SendKind.REJECTED):
        assert isinstance(linked.outcome(SendError(kind, "why"), 1), Failed)


# ---------------------------------------------------------------- the transport with the fake client


def item_of(**kw) -> m.OutboxItem:
    return m.OutboxItem(**{"file_path": "", "reply_to": "", **kw})


class StubGateway:
    """What a channel needs of the gateway: paths, a log, take (the kit's parse, then recorded), a detail line."""

    def __init__(self, tmp_path, verdict: str = "accepted") -> None:
        self.paths = SimpleNamespace(whatsapp_dir=tmp_path / "whatsapp", session_secret_file=tmp_path / ".secret")
        self.log = _Log()
        self.submitted: list[InboundMessage] = []
        self.verdict = verdict
        self.channel = None

    async def take(self, channel, event) -> str:
        parsed = linked.parse(event, channel.id)
        if isinstance(parsed, Skip):
            return "skipped"
        self.submitted.append(parsed.msg)
        return self.verdict

    def detail(self) -> str:
        return f"wa: {self.channel.status}"


class _Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def bind(self, **_kw):
        return self

    def _add(self, event, **kw):
        self.events.append((event, kw))

    debug = info = warning = error = _add


def make_store(tmp_path) -> SessionVault:
    return SessionVault.open(SimpleNamespace(whatsapp_dir=tmp_path / "whatsapp"), "wa")  # keyed from $SESSION_SECRET


def linked_store(tmp_path) -> SessionVault:
    store = make_store(tmp_path)
    store.put("identity", b"fake identity")
    LinkRecord(account=ACCOUNT, linked_at=time.time(), session="s1").write(store)
    return store


def transport(tmp_path, **kw) -> tuple[LinkedTransport, StubGateway]:
    gw = StubGateway(tmp_path, **kw)
    channel = SimpleNamespace(gateway=gw, id="wa", log=gw.log, status="starting")
    gw.channel = channel
    t = LinkedTransport(channel, make_client=FakeClient, backoff=Backoff(first_s=0.02, cap_s=0.1, jitter=0.5))
    t.store = make_store(tmp_path)
    return t, gw


async def until(check, timeout: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def fake_defaults():
    FakeClient.fail_connects, FakeClient.pair_by, FakeClient.last = 0, "scan", None
    yield


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_a_stored_session_connects_and_messages_flow_both_ways(tmp_path):
    async def go():
        linked_store(tmp_path)
        t, gw = transport(tmp_path)
        await t.start()
        runner = asyncio.create_task(t.run())
        await until(lambda: t.link.state is State.LINKED, what="linked")
        assert f"linked-device linked as +{ACCOUNT}" == t.channel.status
        client = FakeClient.last
        await client.deliver(LinkedMessage(id="M1", chat="4915112345678", sender="4915112345678", text="hello"))
        assert ["hello"] == [msg.text for msg in gw.submitted]
        await until(lambda: client.read == ["M1"], what="the read receipt")
        item = item_of(id=1, instance="wa", chat="4915112345678", session_id=1, kind="text",
                            body="**yes** " + "word " * 1000, attempt=1, parts_sent=0)
        progress = []

        async def record(parts, msg_id):
            progress.append(parts)

        outcome = await t.send(item, record)
        assert isinstance(outcome, Sent) and 2 == len(client.sent) and [1] == progress
        assert client.sent[0]["text"].startswith("*yes* ")
        assert isinstance(await t.send(item_of(id=2, instance="wa", chat=NO_ACCOUNT, session_id=1, kind="text",
                                                    body="hi", attempt=1), record), Failed)
        await t.typing("4915112345678", "M1")
        await t.typing_done("4915112345678", "M1")
        assert [("4915112345678", True), ("4915112345678", False)] == client.typing_calls
        assert int(t.store.get("ratchet")) == 3  # every key update saved (one received, two sent)
        runner.cancel()
        await t.close()
    run(go())


def test_drops_reconnect_with_bounded_backoff(tmp_path):
    async def go():
        linked_store(tmp_path)
        t, _ = transport(tmp_path)
        states = []
        t.link.on_change = lambda lk: (states.append((lk.state, lk.attempt)), t._changed(lk))
        FakeClient.fail_connects = 4
        delays = []
        plain = t.backoff.delay
        t.backoff.delay = lambda n: delays.append((n, plain(n))) or delays[-1][1]
        await t.start()
        runner = asyncio.create_task(t.run())
        await until(lambda: t.link.state is State.LINKED, what="linked after failures")
        assert [(State.CONNECTING, n) for n in range(1, 5)] == [s for s in states if s[1]][:4]
        assert [1, 2, 3, 4] == [n for n, _ in delays]
        assert all(0.5 * min(0.1, 0.02 * 2 ** (n - 1)) <= d <= min(0.1, 0.02 * 2 ** (n - 1)) for n, d in delays)
        client = FakeClient.last
        await client.drop()
        await until(lambda: t.link.state is State.CONNECTING, what="connecting after the drop")
        assert "fake: connection reset" in t.link.status()
        started = time.monotonic()
        await until(lambda: t.link.state is State.LINKED, what="linked again")
        assert time.monotonic() - started < 1.0  # the first retry waits about first_s
        assert 6 == client.connects
        sent = await t.send(item_of(id=3, instance="wa", chat="49151", session_id=1, kind="text", body="back",
                                         attempt=1), _no_progress)
        assert isinstance(sent, Sent)
        runner.cancel()
        await t.close()
    run(go())


async def _no_progress(parts, msg_id):
    pass


def test_device_removed_stops_reconnecting_and_is_remembered(tmp_path):
    async def go():
        store = linked_store(tmp_path)
        t, _ = transport(tmp_path)
        await t.start()
        runner = asyncio.create_task(t.run())
        await until(lambda: t.link.state is State.LINKED)
        client = FakeClient.last
        await client.remote_logout(LogoutReason.DEVICE_REMOVED)
        await until(lambda: t.link.state is State.LOGGED_OUT, what="logged out")
        assert "device removed" in t.channel.status and "not reconnecting" in t.channel.status
        await asyncio.sleep(0.3)
        assert 1 == client.connects and client.closed
        assert LogoutReason.DEVICE_REMOVED.name == LinkRecord.read(store).logged_out
        waiting = await t.send(item_of(id=4, instance="wa", chat="49151", session_id=1, kind="text",
                                            body="x", attempt=1), _no_progress)
        assert isinstance(waiting, Retry) and waiting.after_s == linked.LOGGED_OUT_RETRY_S
        runner.cancel()
        await t.close()
        restarted, _ = transport(tmp_path)
        await restarted.start()  # a restarted gateway still knows, and says so
        assert State.LOGGED_OUT is restarted.link.state and "device removed" in restarted.link.status()
    run(go())


def test_another_client_taking_over_stops_reconnecting_but_keeps_the_session(tmp_path):
    async def go():
        store = linked_store(tmp_path)
        t, _ = transport(tmp_path)
        await t.start()
        runner = asyncio.create_task(t.run())
        await until(lambda: t.link.state is State.LINKED)
        await FakeClient.last.remote_logout(LogoutReason.REPLACED)
        await until(lambda: t.link.state is State.LOGGED_OUT)
        assert "another client took over" in t.channel.status
        await asyncio.sleep(0.3)
        assert 1 == FakeClient.last.connects
        assert LinkRecord.read(store).usable  # a restart of the gateway takes it back
        runner.cancel()
        await t.close()
    run(go())


def test_the_gateway_picks_up_a_new_link_and_unlinks_on_request(tmp_path):
    async def go():
        t, _ = transport(tmp_path)
        await t.start()
        assert t.channel.status.startswith("linked-device unlinked")
        runner = asyncio.create_task(t.run())
        await asyncio.sleep(0.1)
        shown = []
        record = await linking.link(t.gateway.paths, "wa", show=shown.append, make_client=FakeClient,
                                    qr=lambda code: f"[QR {code}]")
        assert ACCOUNT == record.account and any("[QR 2@fake-qr-ref" in s for s in shown)
        await until(lambda: t.link.state is State.LINKED, what="the gateway to take the new link")
        answer = await linking.unlink(t.gateway.paths, "wa", show=shown.append, make_client=FakeClient)
        assert answer.startswith("unlinked: WhatsApp removed this device")
        assert State.UNLINKED is t.link.state and [] == t.store.names()
        assert not (t.store.folder / UNLINK_REQUEST).exists()
        runner.cancel()
        await t.close()
    run(go())


def test_linking_by_pair_code_and_refusing_a_second_link(tmp_path):
    async def go():
        paths = SimpleNamespace(whatsapp_dir=tmp_path / "whatsapp")
        shown = []
        await linking.link(paths, "wa", "+49 151 9999 0000", show=shown.append, make_client=FakeClient)
        assert any("FAKE-CODE" in s for s in shown)
        assert FakeClient.last.closed
        with pytest.raises(linked.StarlingError, match="linked already"):
            await linking.link(paths, "wa", show=shown.append, make_client=FakeClient)
        answer = await linking.unlink(paths, "wa", show=shown.append, make_client=FakeClient)
        assert answer.startswith("unlinked")
        assert "not linked" in await linking.unlink(paths, "wa", show=shown.append, make_client=FakeClient)
    run(go())


def test_linking_that_never_completes_times_out_and_stores_nothing(tmp_path):
    async def go():
        FakeClient.pair_by = "never"
        paths = SimpleNamespace(whatsapp_dir=tmp_path / "whatsapp")
        with pytest.raises(linked.StarlingError, match="not linked within"):
            await linking.link(paths, "wa", show=lambda s: None, make_client=FakeClient, timeout_s=0.3)
        assert [] == SessionVault.open(paths, "wa").names()
    run(go())


@pytest.fixture(autouse=True)
def session_secret_env(monkeypatch):
    monkeypatch.setenv("SESSION_SECRET", "test-secret-for-linked-mode")


def test_the_cli_asks_the_gateway_which_pairs_and_sends_the_code_back(tmp_path):
    from common import whatsapp_requests

    async def go():
        t, _ = transport(tmp_path)
        await t.start()
        runner = asyncio.create_task(t.run())
        shown: list[str] = []
        account = await asyncio.to_thread(whatsapp_requests.ask_link, t.gateway.paths, "wa", "", 20.0, shown.append)
        assert ACCOUNT == account and any("Scan this with WhatsApp" in s for s in shown)
        await until(lambda: t.link.state is State.LINKED, what="the gateway to run the session it paired")
        again = asyncio.to_thread(whatsapp_requests.ask_link, t.gateway.paths, "wa", "", 20.0, shown.append)
        with pytest.raises(linked.StarlingError, match="whatsapp unlink wa"):
            await again
        answer = await asyncio.to_thread(whatsapp_requests.ask_unlink, t.gateway.paths, "wa")
        assert answer.startswith("unlinked: WhatsApp removed this device") and State.UNLINKED is t.link.state
        runner.cancel()
        await t.close()
    run(go())


def test_with_no_gateway_to_ask_the_cli_says_so_and_withdraws_the_request(tmp_path, monkeypatch):
    from common import whatsapp_requests

    monkeypatch.setattr(whatsapp_requests, "PICKUP_S", 0.3)
    paths = SimpleNamespace(whatsapp_dir=tmp_path / "whatsapp")
    for ask in (lambda: whatsapp_requests.ask_unlink(paths, "wa"),
                lambda: whatsapp_requests.ask_link(paths, "wa", "", 5.0, print)):
        with pytest.raises(linked.StarlingError, match="is gateway-whatsapp running"):
            ask()
    assert [] == sorted(p.name for p in (tmp_path / "whatsapp" / "wa").iterdir())
