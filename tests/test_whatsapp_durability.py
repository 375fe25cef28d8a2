"""WhatsApp (Cloud API) end to end under load and crashes (DESIGN "The rule of durability"): the fake Graph
API, which also plays Meta's webhook sender (tests/fake_whatsapp.py), a fake model, the writer, a runner and
the gateway as real processes.

Ten numbers, all allowed, each a chat of its own. The fake model answers ``echo: <text>``, so a reply's
text names its message.

- 100 messages: each answered exactly once, in order per chat, every webhook answered 200 at its first
  attempt, every message marked read.
- Webhooks posted concurrently and out of order: each message answered once, in timestamp order per chat.
- kill -9 of the gateway, then of the writer, then of the runner, then of all of them at once during such
  a stream, each started again at once: nothing is lost, every message is one user turn however often its webhook came, and a reply sent twice is
  counted; it is allowed only for a reply in flight at a kill (its outbox row was taken again, and its
  first copy reached the fake just before that kill). The gateway is killed holding a webhook POST it
  had not answered: the writer is paused (SIGSTOP, at most PAUSE_S) until a message goes out, so that
  POST cannot be acked; it must come again to the new gateway and be stored once.
- The same webhook POSTed twice, one copy after the other or both at once, is one turn and one reply.

Redelivery: the fake retries a webhook answered non-2xx or not at all (a refused or cut connection) with
exponential backoff, WEBHOOK_BACKOFF (first, max s), up to WEBHOOK_ATTEMPTS times: about 48 s of retries
here, far longer than a restart. Meta keeps trying for up to 7 days. In the crash tests the fake posts one
delivery at a time, in order (its default ``webhook_concurrency = 1``): a delivery retried while the gateway
is down holds back the ones behind it, so a chat's order holds across the kill. Meta posts concurrently and
out of order: one test has the fake do so (8 at once, a random delay each), and the gateway puts a number's
messages back in the order of their timestamps (services/gateway/order.py). The writer dedupes on the wamid
(``wa:<instance>:m:<wamid>``).

The gateway's outbox lease is 3 s (``[gateways] outbox_lease_s``), as in tests/test_telegram_durability.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections import Counter, defaultdict

import pytest

from common.db import read_tx
from common.stores import outbox_store, turn_store
from tests.fake_whatsapp import DEFAULT_APP_SECRET, DEFAULT_PHONE_NUMBER_ID, post_webhook
from tests.gateway_stack import (
    Feeder, check_sequence, first_copy_in_flight, log_events, repeats_per_kill, stream_plan,
)
from tests.procs import wait_until
from tests.whatsapp_stack import whatsapp_stack

FOLLOWUP = '[conversation]\nqueue = "followup"\n'  # one answer per message: the checks count them
INSTANCE = "wa"
NUMBERS = [f"4917100000{i:02d}" for i in range(10)]  # wa_ids (E.164 digits); the chat is the sender's number
DUP_NUMBERS = ["491710000090", "491710000091"]        # the duplicate-delivery tests' own
CONCURRENT_NUMBERS = [f"4917100001{i:02d}" for i in range(5)]  # the concurrent-delivery test's own
PER_NUMBER = 10
WEBHOOK_ATTEMPTS = 100
WEBHOOK_BACKOFF = (0.05, 0.5)
GATEWAY = (
    "[gateways]\noutbox_lease_s = 3\n"
    f'[[gateways.whatsapp]]\nid = "{INSTANCE}"\nphone_number_id = "{DEFAULT_PHONE_NUMBER_ID}"\n'
    'api_base = "{API}"\nlisten = "{LISTEN}"\n'
    f"allow = {json.dumps(['+' + n for n in NUMBERS + DUP_NUMBERS + CONCURRENT_NUMBERS])}\n"
)
ANSWER_TIMEOUT_S = 30.0
SETTLE_S = 1.5     # after the last expected reply: long enough for a late duplicate to show
IN_FLIGHT_S = 1.0  # a repeated reply's first copy reached the fake at most this long before its kill
PAUSE_S = 1.0      # the writer's pause before the gateway's kill, waiting for a message to go out
IN_POST_S = 0.1    # then this long, so its webhook POST reaches the gateway (and waits for the writer)


def text_of(number: str, k: int) -> str:
    return f"number {number} message {k}"


@contextlib.contextmanager
def stack():
    """The stack with the gateway ready and the fake's webhook retries long enough to outlast a restart."""
    with whatsapp_stack(extra=FOLLOWUP, gateway=GATEWAY) as s:
        s.wa.configure(webhook_attempts=WEBHOOK_ATTEMPTS, webhook_backoff=list(WEBHOOK_BACKOFF))
        s.start_gateway()
        yield s


class People:
    """Sends the numbers' messages through the fake (each queued for webhook delivery); remembers each
    text's wamid."""

    def __init__(self, wa) -> None:
        self.wa = wa
        self.wamid: dict[str, str] = {}

    def send(self, number: str, k: int) -> str:
        text = text_of(number, k)
        self.wamid[text] = self.wa.message(number, text)["wamid"]
        return text


def replies_by_number(s) -> dict[str, list[dict]]:
    by_number: dict[str, list[dict]] = defaultdict(list)
    for record in s.wa.sent():
        by_number[record["wa_id"]].append(record)
    return by_number


def wait_answered(s, expected: dict[str, list[str]], timeout: float = ANSWER_TIMEOUT_S) -> None:
    want = {f"echo: {t}" for texts in expected.values() for t in texts}

    def missing() -> set[str]:
        return want - {r["text"] for r in s.wa.sent()}

    try:
        wait_until(lambda: not missing(), timeout=timeout, interval=0.2, what="every message to be answered")
    except AssertionError:
        gone = sorted(missing())
        raise AssertionError(f"{len(gone)} messages unanswered after {timeout}s, e.g. {gone[:5]};"
                             f" webhooks pending at the fake: {s.wa.pending()};"
                             f" gateway log tail:\n{s.gateway.log_text()[-3000:]}") from None
    time.sleep(SETTLE_S)


def check_database(s, expected: dict[str, list[str]]) -> dict[str, int]:
    """Every message is one user turn (a redelivered webhook is never a second turn), in order, done, with
    one outbox row, sent. Returns the outbox rows taken more than once: {reply text: attempts}."""
    retaken = {}
    with read_tx(s.reader()) as conn:
        for number, texts in expected.items():
            turns = turn_store.user_turns_for_chat(conn, INSTANCE, number)
            assert [t.content for t in turns] == texts, f"{number}: user turns"
            assert [t.state for t in turns] == ["done"] * len(texts), f"{number}: turn states"
            rows = outbox_store.for_chat(conn, INSTANCE, number)
            assert [r.body for r in rows] == [f"echo: {t}" for t in texts], f"{number}: outbox rows"
            assert [r.state for r in rows] == ["sent"] * len(texts), f"{number}: outbox states"
            retaken.update({r.body: r.attempts for r in rows if r.attempts > 1})
    return retaken


def check_deliveries(s, wamids: list[str]) -> list[dict]:
    """Every message's webhook answered 200 in the end, nothing left to deliver; returns the attempts that
    were not (refused, cut, 5xx)."""
    wait_until(lambda: s.wa.pending() == 0, timeout=10, what="the fake's webhook queue to drain")
    attempts = s.wa.deliveries()
    ok = {w for d in attempts if d["status"] == 200 for w in d["wamids"]}
    assert not set(wamids) - ok, sorted(set(wamids) - ok)[:5]
    return [d for d in attempts if d["status"] != 200]


def inbound_duplicates(s) -> int:
    """Inbound writes the writer found already stored (a redelivered webhook whose first copy landed)."""
    return sum(bool(e.get("duplicate")) for e in log_events(s.gateway.log_text(), "inbound"))


# ---------------------------------------------------------------- a hundred messages, no crash


@pytest.fixture(scope="module")
def calm():
    with stack() as s:
        yield s


def test_hundred_messages_from_ten_numbers_answered_once_in_order(calm):
    s = calm
    expected = {n: [text_of(n, k) for k in range(PER_NUMBER)] for n in NUMBERS}
    people = People(s.wa)
    for k in range(PER_NUMBER):  # interleaved, as fast as the fake takes them
        for n in NUMBERS:
            people.send(n, k)
    wait_answered(s, expected)

    got = replies_by_number(s)
    for n in NUMBERS:
        assert [r["text"] for r in got[n]] == [f"echo: {t}" for t in expected[n]], f"number {n}"
    assert len([r for r in s.wa.sent() if r["wa_id"] in NUMBERS]) == len(NUMBERS) * PER_NUMBER
    assert check_database(s, expected) == {}
    wamids = list(people.wamid.values())
    assert check_deliveries(s, wamids) == []  # every webhook answered 200 at once
    assert len([d for d in s.wa.deliveries() if set(d["wamids"]) & set(wamids)]) == len(wamids)
    read = {r["message_id"] for r in s.wa.records("reads")}
    assert set(wamids) <= read  # blue ticks on every message


CONCURRENT_ROUNDS = 3
JITTER_S = 0.12  # each webhook waits up to this long at the fake: within the gateway's skew (0.15 s)


def arrival_order(s, wamids: list[str]) -> list[str]:
    """``wamids`` in the order their first POST reached the gateway (its start: ts - elapsed)."""
    first: dict[str, float] = {}
    for d in s.wa.deliveries():
        for w in d["wamids"]:
            if w in wamids:
                first[w] = min(first.get(w, float("inf")), d["ts"] - d["elapsed"])
    return sorted(wamids, key=lambda w: first[w])


def test_webhooks_posted_concurrently_and_out_of_order_are_answered_in_timestamp_order(calm):
    """Meta posts webhooks concurrently and out of order (the fake: all at once, each after up to JITTER_S): a
    number's messages, stamped a second apart from now on (as if Meta's clock ran up to 2 s ahead, which the
    gateway's longest hold covers) and posted at the same moment, reach the gateway in any order, and are
    each one turn and one reply, stored and answered in the order of their timestamps; every POST answered
    200 at its first attempt."""
    s = calm
    s.wa.configure(webhook_concurrency=16, webhook_jitter=JITTER_S)  # all 15 at once: none queued
    try:
        people = People(s.wa)
        expected: dict[str, list[str]] = {n: [] for n in CONCURRENT_NUMBERS}
        base = int(time.time())
        for n in CONCURRENT_NUMBERS:
            for k in range(CONCURRENT_ROUNDS):  # all at once; the timestamps say the order
                text = text_of(n, k)
                people.wamid[text] = s.wa.message(n, text, timestamp=base + k)["wamid"]
                expected[n].append(text)
        wait_answered(s, expected)
    finally:
        s.wa.configure(webhook_concurrency=1, webhook_jitter=0.0)
    got = replies_by_number(s)
    for n in CONCURRENT_NUMBERS:
        assert check_sequence(n, expected[n], [r["text"] for r in got[n]]) == 0
    assert check_database(s, expected) == {}
    assert check_deliveries(s, list(people.wamid.values())) == []
    # the fake did reorder: some number's messages came the wrong way round (else this proves nothing)
    swapped = [n for n in CONCURRENT_NUMBERS
               if arrival_order(s, [people.wamid[t] for t in expected[n]]) != [people.wamid[t] for t in expected[n]]]
    assert swapped, "every number's webhooks arrived in order: raise JITTER_S"
    print(f"\nnumbers whose webhooks arrived out of order: {len(swapped)} of {len(CONCURRENT_NUMBERS)}")


# ---------------------------------------------------------------- the same webhook twice


def one_answer(s, number: str, text: str) -> tuple[list[str], list[dict], list[dict]]:
    """(user turns, replies, the gateway's inbound log lines) for ``number`` once its reply came and settled."""
    s.replies(number, 1)
    time.sleep(SETTLE_S)
    with read_tx(s.reader()) as conn:
        turns = [t.content for t in turn_store.user_turns_for_chat(conn, INSTANCE, number)]
    logged = [e for e in log_events(s.gateway.log_text(), "inbound") if e.get("chat") == number]
    return turns, s.wa.sent(to=number), logged


def test_the_same_webhook_posted_twice_is_one_turn(calm):
    s, number, text = calm, DUP_NUMBERS[0], "said once, delivered twice"
    payload = s.wa.message(number, text, deliver=False)["payload"]
    attempts = s.wa.deliver(payload=payload, duplicate=1)
    assert [(a["copy"], a["status"]) for a in attempts] == [(0, 200), (1, 200)]
    turns, replies, logged = one_answer(s, number, text)
    assert turns == [text]
    assert [r["text"] for r in replies] == [f"echo: {text}"]
    assert [e["duplicate"] for e in logged] == [False, True]


def test_the_same_webhook_posted_twice_at_once_is_one_turn(calm):
    s, number, text = calm, DUP_NUMBERS[1], "said once, delivered twice at the same moment"
    payload = s.wa.message(number, text, deliver=False)["payload"]
    statuses: list[int] = []
    start = threading.Barrier(2, timeout=5)

    def post() -> None:
        start.wait()
        statuses.extend(a["status"] for a in post_webhook(s.webhook, payload, DEFAULT_APP_SECRET, attempts=1))

    threads = [threading.Thread(target=post, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=15)
    assert not any(t.is_alive() for t in threads)
    assert statuses == [200, 200]
    turns, replies, logged = one_answer(s, number, text)
    assert turns == [text]
    assert [r["text"] for r in replies] == [f"echo: {text}"]
    assert sorted(e["duplicate"] for e in logged) == [False, True]


# ---------------------------------------------------------------- crashes during a stream


def kill_gateway_holding_a_post(s) -> tuple[float, float]:
    """kill -9 the gateway while it holds a webhook POST it cannot answer (the writer paused until a message
    goes out, at most PAUSE_S; tried again a little later when none does), resume the writer and start a new
    gateway. Returns (when the pause began, when the gateway was killed)."""
    for _ in range(20):
        paused = time.time()
        os.kill(s.writer.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + PAUSE_S
            while time.monotonic() < deadline and not s.wa.records("injected", since=paused):
                time.sleep(0.01)
            if s.wa.records("injected", since=paused):
                time.sleep(IN_POST_S)
                killed = time.time()
                s.kill_gateway(restart=False)
        finally:
            os.kill(s.writer.pid, signal.SIGCONT)
        if s.gateway is None:
            s.start_gateway()
            return paused, killed
        time.sleep(0.2)
    raise AssertionError("no message went out while the writer was paused")


# When each number sends its messages (s from the start), the numbers' phases spread over SPREAD_S: a
# message about every 0.1 s in all, for about 9 s, so both kills land in the middle of the stream.
SCHEDULE = [0.0, 0.9, 1.8, 2.7, 3.6, 4.5, 5.4, 6.3, 7.2, 8.1]
SPREAD_S = 0.9


def test_kill_gateway_and_writer_during_a_stream_loses_nothing():
    with stack() as s:
        people = People(s.wa)
        kills: list[tuple[str, float]] = []
        with Feeder(stream_plan(NUMBERS, SCHEDULE, SPREAD_S), people.send) as feed:
            time.sleep(1.5)
            _paused, killed = kill_gateway_holding_a_post(s)
            kills.append(("gateway", killed))

            time.sleep(2.0)
            quiet = time.time()  # the writer is killed as a message goes out: its POST waits for the new one
            wait_until(lambda: s.wa.records("injected", since=quiet), timeout=5, what="a message to go out")
            kills.append(("writer", time.time()))
            s.kill_writer()
            writer_back = time.time()

            time.sleep(1.5)
            kills.append(("runner", s.kill_runner_holding_a_turn(0)))

            time.sleep(1.5)
            kills.append(("all", s.kill_all()))
        expected = feed.finish()
        assert sum(map(len, expected.values())) == len(NUMBERS) * PER_NUMBER
        wait_answered(s, expected)

        # answered, each in order (a repeat comes right after its first copy: a chat's head row is sent again)
        got = replies_by_number(s)
        for n in NUMBERS:
            check_sequence(n, expected[n], [r["text"] for r in got[n]])
        records = s.wa.sent()
        counts = Counter(r["text"] for r in records)
        assert max(counts.values()) <= 2, {t: n for t, n in counts.items() if n > 2}

        # each repeat belongs to a kill: its first copy reached the fake just before it, and its row was retaken
        copies: dict[str, list[float]] = defaultdict(list)
        for r in records:
            copies[r["text"]].append(r["ts"])
        per_kill = repeats_per_kill(copies, kills)
        retaken = check_database(s, expected)
        for text in sorted(t for t, n in counts.items() if n == 2):
            first = min(copies[text])
            assert text in retaken, f"{text!r} sent twice, but its outbox row was taken once"
            assert first_copy_in_flight(first, kills, writer_back, IN_FLIGHT_S), f"{text!r}: first copy not in flight"

        # every webhook answered 200 in the end; the POST the killed gateway held was cut, never answered 200
        # by it, and came again to its successor (stored once: check_database)
        failed = check_deliveries(s, list(people.wamid.values()))
        cut = [d for d in failed if d["ts"] - d["elapsed"] <= killed <= d["ts"] and d["kind"] == "messages"]
        assert cut, f"no webhook POST was in flight at the gateway's kill: {failed[:5]}"
        deliveries = s.wa.deliveries()
        for d in cut:
            [wamid] = d["wamids"]
            answered = [a for a in deliveries if wamid in a["wamids"] and a["status"] == 200]
            assert answered and min(a["ts"] for a in answered) > killed, f"acked before stored: {d}"
        after = {name: sum(at <= d["ts"] - d["elapsed"] < nxt for d in failed)
                 for (name, at), nxt in zip(kills, [k[1] for k in kills[1:]] + [float("inf")])}
        # webhook POSTs that came while the writer was down: held by the gateway until the new writer acked
        writer_killed = kills[1][1]
        waited = [d for d in deliveries if d["ts"] - d["elapsed"] <= writer_back and d["ts"] >= writer_killed]
        assert waited, "no webhook POST came while the writer was down"
        retaken_logged = len(log_events(s.gateway.log_text(), "outbox_retaken"))
        print(f"\nduplicates per kill: {per_kill} (total {sum(per_kill.values())});"
              f" outbox rows taken again: {len(retaken)} (logged outbox_retaken: {retaken_logged});"
              f" webhook POSTs the killed gateway held unanswered: {len(cut)};"
              f" webhook POSTs during the writer's restart ({writer_back - writer_killed:.2f} s): {len(waited)},"
              f" answered 200: {sum(d['status'] == 200 for d in waited)};"
              f" webhook attempts not answered 200: {len(failed)} (after each kill: {after}),"
              f" inbound found already stored: {inbound_duplicates(s)}")
        assert per_kill.get("none", 0) == 0, per_kill
        for proc in (s.gateway, s.writer, *s.runners):
            assert proc.alive(), proc.log_text()[-2000:]
