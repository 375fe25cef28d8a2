"""Slack and the writer's absence (DESIGN "The rule of durability", rule 1): Slack redelivers an unacked
Socket Mode envelope 3 times over about 5 minutes, then never again; the writer here is away for a
"10-minute" outage, with time scaled 1:30 in the fake (its 3 redeliveries 2.5 s apart, so an envelope
expires 10 s after it first came; the writer is away 20 s), the count of redeliveries left as Slack's.

The writer is killed (-9) early in a stream of five DMs and stays down; the gateway acknowledges each
event once it is fsynced in its spool. Midway the gateway is killed (-9) too, holding spooled events
Slack will never send again, and started again at once (it waits for the writer). Then the writer comes
back: the new gateway hands the spool to it first, in order, then takes the stream's last messages.
Every message is answered once and in order, no envelope expired, and sampled all along, every
envelope Slack got an ack for is in the spool or stored.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict

from common.db import read_tx
from common.held_files import read_spool
from common.stores import turn_store
from tests.gateway_stack import Feeder, log_events, stream_plan
from tests.procs import start_writer, wait_until
from tests.slack_stack import slack_stack

DMS = [f"D0OUT{i}" for i in range(5)]
USER = {d: f"U0OUT{i}" for i, d in enumerate(DMS)}
GATEWAY = ("[gateways]\noutbox_lease_s = 3\n"
           '[[gateways.slack]]\nid = "sl"\napi_base = "{API}"\nping_interval_s = 1\n'
           f"allow = {json.dumps(sorted(USER.values()))}\n")
ACK_TIMEOUT_S = 2.5   # Slack's spacing of redeliveries, scaled
MAX_RETRIES = 3       # Slack's count, not scaled
KILL_WRITER_AT_S = 1.0
OUTAGE_S = 20.0       # a 10-minute outage at 1:30, twice as long as Slack keeps an envelope
KILL_GATEWAY_AT_S = 11.0
SCHEDULE = [0.0, 1.5, 3.0, 4.5, 6.0, 7.5, 9.0, 26.0, 28.0]  # nothing sent while no gateway is connected
SPREAD_S = 1.0
FOLLOWUP = '[conversation]\nqueue = "followup"\n'  # each message its own answer, the spooled backlog too


def text_of(dm: str, k: int) -> str:
    return f"{dm} message {k}"


def test_a_writer_away_longer_than_slacks_retries_loses_nothing():
    with slack_stack(gateway=GATEWAY, extra=FOLLOWUP, ack_timeout=ACK_TIMEOUT_S, max_retries=MAX_RETRIES) as s:
        s.start_gateway()
        spool_file = s.home.paths.spool_dir / "gateway-slack.spool"
        event_text: dict[str, str] = {}

        def send(dm: str, k: int) -> str:
            env = s.sl.message(dm, USER[dm], text_of(dm, k), channel_type="im")
            event_text[env["payload"]["event_id"]] = text_of(dm, k)
            return text_of(dm, k)

        def stored() -> set[str]:
            with read_tx(s.reader()) as conn:
                return {t.content for dm in DMS for t in turn_store.user_turns_for_chat(conn, "sl", dm)}

        def acked_but_not_durable() -> set[str]:
            envelopes = {e["envelope_id"]: e["event_id"] for e in s.sl.records("envelopes")}
            acked = {envelopes.get(a["envelope_id"]) for a in s.sl.records("acks")}
            in_spool = set()
            if spool_file.exists():
                for line in spool_file.read_bytes().splitlines():
                    with contextlib.suppress(ValueError):
                        in_spool.add(json.loads(line).get("event", {}).get("payload", {}).get("event_id"))
            return {event_text[e] for e in acked if e in event_text and e not in in_spool} - stored()

        def check() -> None:
            early = acked_but_not_durable()
            assert not early, f"acked, neither spooled nor stored: {sorted(early)[:5]}"

        start = time.monotonic()

        def until(at_s: float) -> None:
            while time.monotonic() - start < at_s:
                check()
                time.sleep(0.1)

        with Feeder(stream_plan(DMS, SCHEDULE, SPREAD_S), send) as feed:
            until(KILL_WRITER_AT_S)
            s.kill_writer(restart=False)
            until(KILL_GATEWAY_AT_S)
            wait_until(lambda: s.sl.pending() == [], 5, what="every envelope so far acked (spooled)")
            held = len(read_spool(spool_file)[0])
            assert held >= len(DMS) * 5, held  # acknowledged to Slack, only in the spool
            s.kill_gateway(restart=False)
            s.start_gateway(wait_ready=False)  # it waits for the writer
            until(KILL_WRITER_AT_S + OUTAGE_S)
            assert stored() <= {text_of(dm, 0) for dm in DMS}  # the writer was away all along
            s.writer = start_writer(s.home)
            sent = feed.finish(timeout=60)

        want = {f"echo: {t}" for texts in sent.values() for t in texts}

        def answered() -> bool:
            check()
            return want <= {p["text"] for p in s.sl.records("posted")}

        try:
            wait_until(answered, 60, interval=0.3, what="every message to be answered")
        except AssertionError as exc:
            missing = sorted(want - {p["text"] for p in s.sl.records("posted")})
            raise AssertionError(f"{exc}: {len(missing)} unanswered, e.g. {missing[:5]}; gateway log tail:\n"
                                 f"{s.gateway.log_text()[-4000:]}") from None
        time.sleep(1.5)
        by_dm = defaultdict(list)
        for post in s.sl.records("posted"):
            by_dm[post["channel"]].append(post["text"])
        for dm in DMS:
            assert by_dm[dm] == [f"echo: {t}" for t in sent[dm]], f"{dm}: {by_dm[dm]}"
        assert s.sl.records("expired") == []  # none waited out Slack's retries unacked
        assert s.sl.pending() == []
        replayed = log_events(s.gateway.log_text(), "spool_replayed")
        assert replayed and replayed[-1]["events"] == held  # the successor handed on what it found
        wait_until(lambda: read_spool(spool_file)[0] == [], 10, what="the spool to drain")
        with read_tx(s.reader()) as conn:  # each once (a replayed event is deduped by its event id)
            for dm in DMS:
                assert [t.content for t in turn_store.user_turns_for_chat(conn, "sl", dm)] == sent[dm]
