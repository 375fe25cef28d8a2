"""Slack end to end under load and crashes (DESIGN "The rule of durability"): the fake Slack in Socket Mode,
a fake model, the writer, a runner and the gateway as real processes.

Ten conversations in ten channels, all users allowed: five DMs, and five channel threads, each started by a
mention and continued by replies in the thread that do not mention the bot. The fake model answers
``echo: <text>``, so a reply's text names its message.

- 100 events: each answered exactly once, in order per conversation, in the right place (a DM's reply
  outside any thread, a thread's in its thread), and every envelope acked.
- kill -9 of the gateway, then of the writer, then of the runner, then of all of them at once during such a
  stream, each started again at once: nothing is
  lost, every envelope is acked in the end (none expired), and a reply posted twice is counted; it is
  allowed only for a reply in flight at a kill (its outbox row was taken again, and its first copy reached
  Slack just before that kill). The gateway is killed holding outbox rows and envelopes it read but had
  not acked: the writer is paused (SIGSTOP) for at most PAUSE_S, until an envelope goes out, so that one
  cannot be acked; it must come again to the new gateway and be stored once.

Redelivery at Slack's count and spacing, ten times faster: an events_api envelope not acked within
``ack_timeout`` (0.3 s here, Slack's is 3 s) is sent again at once, then 6 s and 30 s later (Slack: 1 and 5
minutes), 3 retries in all, then it expires (a test that loses one fails: check_envelopes). A gateway
killed before acking gets the envelope again from its successor; the writer dedupes on event id.
One conversation's messages are at least 0.5 s apart, longer than the ack timeout: an envelope the killed
gateway held comes back before the conversation's next one, so order holds. (Slack retries after 3 s and
more; a conversation that goes on meanwhile gets its redelivered message after newer ones, and nothing in
Starling puts it back in place: that is not tested here.)

The gateway's outbox lease is 3 s (``[gateways] outbox_lease_s``), as in tests/test_telegram_durability.py.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter, defaultdict

from common.db import read_tx
from common.stores import outbox_store, turn_store
from tests.fake_slack import SLACK_RETRY_DELAYS
from tests.gateway_stack import (
    Feeder, check_sequence, first_copy_in_flight, log_events, repeats_per_kill, stream_plan,
)
from tests.procs import wait_until
from tests.slack_stack import slack_stack

FOLLOWUP = '[conversation]\nqueue = "followup"\n'  # one answer per message: the checks count them
INSTANCE = "sl"
DMS = [f"D0DUR{i:02d}" for i in range(5)]
CHANNELS = [f"C0DUR{i:02d}" for i in range(5)]
CONVERSATIONS = DMS + CHANNELS  # by the channel each lives in (a channel holds one thread here)
USER = {name: f"U0DUR{i:02d}" for i, name in enumerate(CONVERSATIONS)}
PER_CONVERSATION = 10
ACK_TIMEOUT_S = 0.3
MAX_RETRIES = 3  # Slack's
RETRY_DELAYS = [d / 10 for d in SLACK_RETRY_DELAYS]
GATEWAY = (
    "[gateways]\noutbox_lease_s = 3\n"
    f'[[gateways.slack]]\nid = "{INSTANCE}"\napi_base = "{{API}}"\nping_interval_s = 1\n'
    f"allow = {json.dumps(sorted(USER.values()))}\n"
)
ANSWER_TIMEOUT_S = 40.0
SETTLE_S = 1.5    # after the last expected reply: long enough for a late duplicate to show
IN_FLIGHT_S = 1.0  # a repeated reply's first copy reached Slack at most this long before its kill
PAUSE_S = 0.15     # the writer's pause before the gateway's kill: shorter than the ack timeout, so nothing is
#                    redelivered to the gateway about to die


def text_of(name: str, k: int) -> str:
    return f"conversation {name} message {k}"


class Conversations:
    """Sends the conversations' messages to the fake: DMs as message.im, a channel's first message as a
    mention that starts a thread, its next ones as replies in that thread."""

    def __init__(self, sl) -> None:
        self.sl = sl
        self.thread: dict[str, str] = {}  # channel -> the thread's ts (its mention's)

    def send(self, name: str, k: int) -> str:
        text = text_of(name, k)
        if name in DMS:
            self.sl.message(name, USER[name], text, channel_type="im")
        elif k == 0:
            env = self.sl.app_mention(name, USER[name], text)
            self.thread[name] = env["payload"]["event"]["ts"]
        else:
            self.sl.message(name, USER[name], text, thread_ts=self.thread[name], channel_type="channel")
        return text

    def chat(self, name: str) -> str:
        """The conversation's key in Starling: the DM's channel, or `<channel>:<thread ts>`."""
        return name if name in DMS else f"{name}:{self.thread[name]}"

    def replies(self) -> dict[str, list[dict]]:
        """Posted messages by conversation, in the order they reached the fake; a post anywhere else
        (a thread's reply outside its thread, a DM's inside one) fails."""
        by_name: dict[str, list[dict]] = defaultdict(list)
        for post in self.sl.records("posted"):
            name = post["channel"]
            where = None if name in DMS else self.thread.get(name)
            assert name in CONVERSATIONS and post["thread_ts"] == where, f"posted in the wrong place: {post}"
            by_name[name].append(post)
        return by_name


def wait_answered(s, expected: dict[str, list[str]], timeout: float = ANSWER_TIMEOUT_S) -> None:
    want = {f"echo: {t}" for texts in expected.values() for t in texts}

    def missing() -> set[str]:
        return want - {p["text"] for p in s.sl.records("posted")}

    try:
        wait_until(lambda: not missing(), timeout=timeout, interval=0.2, what="every message to be answered")
    except AssertionError:
        gone = sorted(missing())
        raise AssertionError(f"{len(gone)} messages unanswered after {timeout}s, e.g. {gone[:5]};"
                             f" gateway log tail:\n{s.gateway.log_text()[-3000:]}") from None
    time.sleep(SETTLE_S)


def check_database(s, convs: Conversations, expected: dict[str, list[str]]) -> dict[str, int]:
    """Every message is one user turn (a redelivered envelope is never a second turn), in order, done, with
    one outbox row, sent. Returns the outbox rows taken more than once: {reply text: attempts}."""
    retaken = {}
    with read_tx(s.reader()) as conn:
        for name, texts in expected.items():
            chat = convs.chat(name)
            turns = turn_store.user_turns_for_chat(conn, INSTANCE, chat)
            assert [t.content for t in turns] == texts, f"{chat}: user turns"
            assert [t.state for t in turns] == ["done"] * len(texts), f"{chat}: turn states"
            rows = outbox_store.for_chat(conn, INSTANCE, chat)
            assert [r.body for r in rows] == [f"echo: {t}" for t in texts], f"{chat}: outbox rows"
            assert [r.state for r in rows] == ["sent"] * len(texts), f"{chat}: outbox states"
            retaken.update({r.body: r.attempts for r in rows if r.attempts > 1})
    return retaken


def check_envelopes(s, kills: list[tuple[str, float]] = ()) -> dict:
    """Every envelope acked in the end and none expired; returns what redelivery cost: envelopes sent again
    (in all, and after each kill until the next), and inbound writes the writer found already stored."""
    assert s.sl.pending() == [], s.sl.pending()[:5]
    assert s.sl.records("expired") == []
    again = [e["time"] for e in s.sl.records("envelopes") if e["attempt"] > 0]
    bounds = [at for _, at in kills] + [float("inf")]
    return {"redelivered": len(again),
            "after": {name: sum(bounds[i] <= t < bounds[i + 1] for t in again) for i, (name, _) in enumerate(kills)},
            "inbound_duplicates": sum(bool(e.get("duplicate")) for e in log_events(s.gateway.log_text(), "inbound"))}


def test_hundred_events_from_ten_channels_answered_once_in_order():
    expected = {name: [text_of(name, k) for k in range(PER_CONVERSATION)] for name in CONVERSATIONS}
    with slack_stack(extra=FOLLOWUP, gateway=GATEWAY, ack_timeout=ACK_TIMEOUT_S, max_retries=MAX_RETRIES) as s:
        s.sl.configure(retry_delays=RETRY_DELAYS)
        s.start_gateway()
        convs = Conversations(s.sl)
        for k in range(PER_CONVERSATION):  # interleaved, as fast as the fake takes them
            for name in CONVERSATIONS:
                convs.send(name, k)
        wait_answered(s, expected)

        got = convs.replies()
        assert sorted(got) == sorted(CONVERSATIONS)
        for name in CONVERSATIONS:
            assert [p["text"] for p in got[name]] == [f"echo: {t}" for t in expected[name]], name
        assert len(s.sl.records("posted")) == len(CONVERSATIONS) * PER_CONVERSATION
        assert check_database(s, convs, expected) == {}
        cost = check_envelopes(s)
        print(f"\nenvelopes redelivered (not acked within {ACK_TIMEOUT_S}s): {cost['redelivered']};"
              f" of those found already stored: {cost['inbound_duplicates']}")


def kill_gateway_holding_envelopes(s) -> tuple[float, list[dict]]:
    """kill -9 the gateway while it holds an envelope it read but cannot ack (the writer paused until one
    goes out, at most PAUSE_S; tried again a little later when none does), resume the writer and start a
    new gateway. Returns the kill's time and the envelopes sent to the killed gateway since the pause."""
    for _ in range(20):
        paused = time.time()
        os.kill(s.writer.pid, signal.SIGSTOP)
        try:
            deadline = time.monotonic() + PAUSE_S
            while time.monotonic() < deadline and not s.sl.records("envelopes", since=paused):
                time.sleep(0.01)
            if s.sl.records("envelopes", since=paused):
                killed = time.time()
                s.kill_gateway(restart=False)
        finally:
            os.kill(s.writer.pid, signal.SIGCONT)
        if s.gateway is None:
            held = [e for e in s.sl.records("envelopes", since=paused) if e["time"] <= killed]
            s.start_gateway()
            return killed, held
        time.sleep(0.2)
    raise AssertionError("no envelope went out while the writer was paused")


# When each conversation sends its messages (s from the start): four faster than Slack's pace of one post a
# second per channel, so the gateway holds claimed rows waiting for their turn when it is killed, then
# slower than that pace, so the backlog drains while the stream goes on. Never closer than 0.5 s: longer
# than the ack timeout, so an envelope the killed gateway held is redelivered before the next one.
SCHEDULE = [0.0, 0.5, 1.0, 1.5, 2.9, 4.3, 5.7, 7.1, 8.5, 9.9]
SPREAD_S = 1.4  # conversations start spread over this, so replies are not posted in bursts


def test_kill_gateway_and_writer_during_a_stream_loses_nothing():
    with slack_stack(extra=FOLLOWUP, gateway=GATEWAY, ack_timeout=ACK_TIMEOUT_S, max_retries=MAX_RETRIES) as s:
        s.sl.configure(retry_delays=RETRY_DELAYS)
        s.start_gateway()
        convs = Conversations(s.sl)
        reader = s.reader()

        def held_rows() -> int:
            with read_tx(reader) as conn:
                return outbox_store.count_by_state(conn).get("claimed", 0)

        kills: list[tuple[str, float]] = []
        with Feeder(stream_plan(CONVERSATIONS, SCHEDULE, SPREAD_S), convs.send) as feed:
            time.sleep(2.0)
            wait_until(lambda: held_rows() >= 3, timeout=5, what="the gateway to hold outbox rows")
            killed, in_flight = kill_gateway_holding_envelopes(s)
            kills.append(("gateway", killed))

            time.sleep(3.0)
            kills.append(("writer", time.time()))
            s.kill_writer()
            writer_back = time.time()

            time.sleep(1.5)
            kills.append(("runner", s.kill_runner_holding_a_turn(0)))

            time.sleep(1.5)
            kills.append(("all", s.kill_all()))
        expected = feed.finish()
        assert sum(map(len, expected.values())) == len(CONVERSATIONS) * PER_CONVERSATION
        wait_answered(s, expected)

        # answered, each in order and in its place (a repeat comes right after its first copy: a
        # conversation's head row is posted again)
        got = convs.replies()
        for name in CONVERSATIONS:
            check_sequence(name, expected[name], [p["text"] for p in got[name]])
        posts = s.sl.records("posted")
        counts = Counter(p["text"] for p in posts)
        assert max(counts.values()) <= 2, {t: n for t, n in counts.items() if n > 2}

        # each repeat belongs to a kill: its first copy reached Slack just before it, and its row was retaken
        copies: dict[str, list[float]] = defaultdict(list)
        for p in posts:
            copies[p["text"]].append(p["time"])
        per_kill = repeats_per_kill(copies, kills)
        retaken = check_database(s, convs, expected)
        repeated = sorted(t for t, n in counts.items() if n == 2)
        for text in repeated:
            first = min(copies[text])
            assert text in retaken, f"{text!r} posted twice, but its outbox row was taken once"
            assert first_copy_in_flight(first, kills, writer_back, IN_FLIGHT_S), f"{text!r}: first copy not in flight"
        cost = check_envelopes(s, kills)
        # the envelopes the killed gateway read but could not ack: never acked as sent to it, acked when
        # they came again (and stored once: check_database)
        acks = s.sl.records("acks")
        assert in_flight
        for env in in_flight:
            assert not [a for a in acks if a["envelope_id"] == env["envelope_id"]], f"acked before stored: {env}"
            assert [a for a in acks if a["delivery"] == env["delivery"] and a["attempt"] > env["attempt"]], env
        retaken_logged = len(log_events(s.gateway.log_text(), "outbox_retaken"))
        print(f"\nduplicates per kill: {per_kill} (total {sum(per_kill.values())});"
              f" outbox rows taken again: {len(retaken)} (logged outbox_retaken: {retaken_logged});"
              f" envelopes the killed gateway held unacked: {len(in_flight)};"
              f" envelopes redelivered: {cost['redelivered']} (after each kill: {cost['after']}),"
              f" found already stored: {cost['inbound_duplicates']}")
        assert per_kill.get("none", 0) == 0, per_kill
        assert retaken_logged >= 1  # rows a killed gateway held (3 or more were claimed just before), taken back
        for proc in (s.gateway, s.writer, *s.runners):
            assert proc.alive(), proc.log_text()[-2000:]
