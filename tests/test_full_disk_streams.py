"""A real full disk under a stream on each platform (DESIGN "The rule of durability", rule 1): data_dir is
a small tmpfs (tests/small_disk.py) filled with a file while conversations go on, held full for longer
than any retry budget (Telegram's old give-up after 5 tries, the 3 s outbox and turn leases, the fake
Slack's 3 redeliveries), then freed.

Every message is answered once and in order, every process lives through it without a restart, and
nothing is confirmed early: sampled all along, every Telegram update confirmed (the offset past it),
every Slack envelope acked and every WhatsApp webhook answered 200 is stored by the writer or, for
Slack only, in the gateway's fsynced spool. On Telegram the operator hears about it while the disk is
full (the alert goes out through the writer's reserve) and /health is down with the reason.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict

from common.db import read_tx
from common.held_files import read_spool
from common.stores import turn_store
from tests.gateway_stack import Feeder, stream_plan
from tests.procs import Proc, wait_until
from tests.small_disk import fill, free, small_disk
from tests.whatsapp_stack import free_port

DISK_MB = 48
FILL_AT_S = 2.5   # into the stream
HOLD_S = 15.0     # full for this long: longer than any retry budget (the module's docstring)
PER_CHAT = 8
SCHEDULE = [0.0, 1.5, 4.0, 7.0, 10.0, 13.0, 16.0, 19.0]  # k=2..6 come while the disk is full
SPREAD_S = 1.0
ANSWER_TIMEOUT_S = 60.0
SETTLE_S = 1.5
# each message its own answer (not a burst folded into one), so "answered once, in order" holds message by message
EXTRA = '[writer]\nreserve_mb = 2\ncheckpoint_interval_s = 0.5\n[conversation]\nqueue = "followup"\n'


def text_of(chat, k: int) -> str:
    return f"chat {chat} message {k}"


def add_health_keys(s, keys: str) -> None:
    """More [health] keys in the stack's config.toml (read by the processes started after)."""
    cfg = s.home.paths.config_file
    text = cfg.read_text()
    assert "[health]\n" in text
    cfg.write_text(text.replace("[health]\n", "[health]\n" + keys, 1))


def stored(s, instance: str, chats) -> set[str]:
    with read_tx(s.reader()) as conn:
        return {t.content for chat in chats for t in turn_store.user_turns_for_chat(conn, instance, str(chat))}


def writer_state(s) -> str:
    from common.stores import beat_store
    with read_tx(s.reader()) as conn:
        return next((b.state for b in beat_store.all_beats(conn) if b.service == "writer"), "")


def through_a_full_disk(s, plan, send, confirmed_but_not_durable, on_full=None) -> dict:
    """Run the stream; fill the disk FILL_AT_S in, hold it HOLD_S, free it. ``confirmed_but_not_durable()``
    (what the platform was told is handled and is not durable here) is sampled all along and must stay
    empty. Returns what was sent, per chat."""
    data = s.home.paths.data_dir
    pids = {p.service + str(i): p.pid for i, p in enumerate([s.writer, s.gateway, *s.runners])}
    with Feeder(plan, send) as feed:
        time.sleep(FILL_AT_S)
        filled_at = time.monotonic()
        fill(data)
        wait_until(lambda: writer_state(s) == "disk_full", 15, interval=0.1, what="the writer to find the disk full")
        while time.monotonic() - filled_at < HOLD_S:
            early = confirmed_but_not_durable()
            assert not early, f"confirmed to the platform, not durable here: {sorted(early)[:5]}"
            if on_full is not None:
                on_full()
            time.sleep(0.2)
        assert writer_state(s) == "disk_full"
        free(data)
        sent = feed.finish()
    wait_until(lambda: writer_state(s) == "ready", 15, interval=0.1, what="the writer to take everything again")
    for i, p in enumerate([s.writer, s.gateway, *s.runners]):
        assert p.alive() and p.pid == pids[p.service + str(i)], f"{p.service} died:\n{p.log_text()[-2000:]}"
    return sent


def wait_answered(s, replies, expected: dict, confirmed_but_not_durable) -> None:
    want = {f"echo: {t}" for texts in expected.values() for t in texts}

    def done() -> bool:
        early = confirmed_but_not_durable()
        assert not early, f"confirmed to the platform, not durable here: {sorted(early)[:5]}"
        return want <= {text for texts in replies().values() for text in texts}

    try:
        wait_until(done, ANSWER_TIMEOUT_S, interval=0.3, what="every message to be answered")
    except AssertionError as exc:
        if "timed out" not in str(exc):
            raise
        missing = sorted(want - {text for texts in replies().values() for text in texts})
        raise AssertionError(f"{len(missing)} unanswered, e.g. {missing[:5]}; gateway log tail:\n"
                             f"{s.gateway.log_text()[-3000:]}") from None
    time.sleep(SETTLE_S)


def answered_once_in_order(replies: dict, expected: dict) -> None:
    for chat, texts in expected.items():
        assert replies.get(chat) == [f"echo: {t}" for t in texts], f"chat {chat}: {replies.get(chat)}"


def no_tracebacks(*procs: Proc) -> None:
    for proc in procs:
        assert "Traceback" not in proc.log_text(), f"{proc.service}:\n{proc.log_text()[-3000:]}"


# ---------------------------------------------------------------- Telegram, with the operator's alert


TG_USERS = [2001, 2002, 2003, 2004, 2005]
OPERATOR = 42  # the operator's chat ([health] alert_to), not one of the stream's


def health(port: int, token: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/health",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (urllib.error.URLError, ConnectionError):  # not listening yet
        return 0, {}


def test_telegram_through_a_full_disk_loses_nothing_and_the_operator_hears_of_it():
    from tests.telegram_stack import stack

    gateway = ("[gateways]\noutbox_lease_s = 3\n"
               '[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{TG}"\n'
               f"allow = [{', '.join(map(str, [OPERATOR, *TG_USERS]))}]\n")
    port = free_port()
    with small_disk(DISK_MB) as root, stack(root=root, gateway=gateway, extra=EXTRA + f'[control]\nlisten = "127.0.0.1:{port}"\n') as s:
        add_health_keys(s, f'alert_to = "tg:{OPERATOR}"\ndisk_warn_threshold_mb = 1\n')
        s.start_gateway()
        control = Proc(s.home, "control")
        s.extra_procs.append(control)
        wait_until(lambda: health(port)[0] in (200, 503), 15, what="control to listen")
        token = (s.home.paths.data_dir / ".control-token").read_text().strip()
        update_text: dict[int, str] = {}

        def send(user: int, k: int) -> str:
            update = s.tg.message(text_of(user, k), user=user)
            update_text[update["update_id"]] = text_of(user, k)
            return text_of(user, k)

        def confirmed_but_not_durable() -> set[str]:
            injected = set(update_text)                                  # first what was sent,
            pending = {u["update_id"] for u in s.tg.pending_updates()}   # then what Telegram still holds,
            done = stored(s, "tg", TG_USERS)                             # then what is stored
            return {update_text[u] for u in injected - pending} - done

        seen_down: list[dict] = []

        def on_full() -> None:
            if not seen_down:
                status, report = health(port, token)
                if status == 503:
                    seen_down.append(report)

        sent = through_a_full_disk(s, stream_plan(TG_USERS, SCHEDULE, SPREAD_S), send, confirmed_but_not_durable,
                                   on_full)
        freed_at = time.time()

        def replies() -> dict:
            by_chat = defaultdict(list)
            for r in s.tg.sent():
                by_chat[r["chat_id"]].append(r["text"])
            return by_chat

        wait_answered(s, replies, sent, confirmed_but_not_durable)
        answered_once_in_order(replies(), sent)
        assert s.tg.pending_updates() == []

        # while full: /health said down, and why; the operator was told before the disk was freed
        assert seen_down and seen_down[0]["status"] == "down"
        writer = seen_down[0]["checks"]["services"]["services"]["writer"]
        assert writer["status"] == "disk_full" and "full" in writer["detail"]
        alerts = s.tg.sent(chat_id=OPERATOR)
        assert any("down" in r["text"] and "disk is full" in r["text"] and r["ts"] <= freed_at for r in alerts), alerts
        wait_until(lambda: any("recovered" in r["text"] for r in s.tg.sent(chat_id=OPERATOR)), 20,
                   what="the all-clear")
        no_tracebacks(s.writer, s.gateway, *s.runners, control)
        assert "updates_given_up" not in s.gateway.log_text()


# ---------------------------------------------------------------- Slack, with the spool


SL_DMS = [f"D0FULL{i}" for i in range(5)]
SL_USER = {d: f"U0FULL{i}" for i, d in enumerate(SL_DMS)}


def test_slack_through_a_full_disk_acks_only_what_is_stored_or_spooled():
    from tests.slack_stack import slack_stack

    gateway = ("[gateways]\noutbox_lease_s = 3\n"
               '[[gateways.slack]]\nid = "sl"\napi_base = "{API}"\nping_interval_s = 1\n'
               f"allow = {json.dumps(sorted(SL_USER.values()))}\n")
    # Slack's retries, scaled: redelivered every 2 s, 3 times, then gone (far shorter than the full disk)
    with small_disk(DISK_MB) as root, slack_stack(root=root, gateway=gateway, extra=EXTRA, ack_timeout=2.0,
                                                  max_retries=3) as s:
        s.start_gateway()
        event_text: dict[str, str] = {}
        spool_file = s.home.paths.spool_dir / "gateway-slack.spool"

        def send(dm: str, k: int) -> str:
            env = s.sl.message(dm, SL_USER[dm], text_of(dm, k), channel_type="im")
            event_text[env["payload"]["event_id"]] = text_of(dm, k)
            return text_of(dm, k)

        def confirmed_but_not_durable() -> set[str]:
            envelopes = {e["envelope_id"]: e["event_id"] for e in s.sl.records("envelopes")}
            acked = {envelopes.get(a["envelope_id"]) for a in s.sl.records("acks")}  # first what Slack was told,
            in_spool = set()                                                           # then what the spool holds,
            if spool_file.exists():
                for line in spool_file.read_bytes().splitlines():
                    with contextlib.suppress(ValueError):
                        in_spool.add(json.loads(line).get("event", {}).get("payload", {}).get("event_id"))
            done = stored(s, "sl", SL_DMS)                                             # then what is stored
            return {event_text[e] for e in acked if e in event_text and e not in in_spool} - done

        sent = through_a_full_disk(s, stream_plan(SL_DMS, SCHEDULE, SPREAD_S), send, confirmed_but_not_durable)

        def replies() -> dict:
            by_chat = defaultdict(list)
            for p in s.sl.records("posted"):
                by_chat[p["channel"]].append(p["text"])
            return by_chat

        wait_answered(s, replies, sent, confirmed_but_not_durable)
        answered_once_in_order(replies(), sent)
        assert s.sl.records("expired") == []  # nothing waited out Slack's retries unacked
        assert s.sl.pending() == []
        assert '"event":"spooling"' in s.gateway.log_text()  # the spool carried the full disk
        wait_until(lambda: read_spool(spool_file)[0] == [], 10, what="the spool to drain")
        no_tracebacks(s.writer, s.gateway, *s.runners)


# ---------------------------------------------------------------- WhatsApp


WA_NUMBERS = [f"4917200000{i:02d}" for i in range(5)]


def test_whatsapp_through_a_full_disk_answers_200_only_for_what_is_stored():
    from tests.fake_whatsapp import DEFAULT_PHONE_NUMBER_ID
    from tests.whatsapp_stack import whatsapp_stack

    gateway = ("[gateways]\noutbox_lease_s = 3\n"
               f'[[gateways.whatsapp]]\nid = "wa"\nphone_number_id = "{DEFAULT_PHONE_NUMBER_ID}"\n'
               'api_base = "{API}"\nlisten = "{LISTEN}"\n'
               f"allow = {json.dumps(['+' + n for n in WA_NUMBERS])}\n")
    with small_disk(DISK_MB) as root, whatsapp_stack(root=root, gateway=gateway, extra=EXTRA) as s:
        s.wa.configure(webhook_attempts=100, webhook_backoff=[0.05, 0.5])  # Meta keeps trying for days
        s.start_gateway()
        wamid_text: dict[str, str] = {}

        def send(number: str, k: int) -> str:
            wamid_text[s.wa.message(number, text_of(number, k))["wamid"]] = text_of(number, k)
            return text_of(number, k)

        def confirmed_but_not_durable() -> set[str]:
            ok = {w for d in s.wa.deliveries() if d.get("status") == 200 for w in d.get("wamids", [])}
            done = stored(s, "wa", WA_NUMBERS)
            return {wamid_text[w] for w in ok if w in wamid_text} - done

        sent = through_a_full_disk(s, stream_plan(WA_NUMBERS, SCHEDULE, SPREAD_S), send, confirmed_but_not_durable)

        def replies() -> dict:
            by_chat = defaultdict(list)
            for r in s.wa.sent():
                by_chat[r["wa_id"]].append(r["text"])
            return by_chat

        wait_answered(s, replies, sent, confirmed_but_not_durable)
        answered_once_in_order(replies(), sent)
        refused = Counter(d["status"] for d in s.wa.deliveries() if d.get("status") != 200)
        assert refused, "no webhook was held back while the disk was full"
        no_tracebacks(s.writer, s.gateway, *s.runners)
