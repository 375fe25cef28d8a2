"""Slack end-to-end benchmark: from an event's envelope sent over Socket Mode to its reply's chat.postMessage
arriving at Slack.

    python bench/slack_e2e.py [--seconds 30] [--warmup 5] [--channels 20] [--period 1.2] [--runners 2] [--keep]
    python bench/slack_e2e.py --stream [--drafts on|off] [--channels 4] [--period 6] ...
    python -m bench.slack_e2e ...

Processes, each its own as in production: the fake Slack (tests/fake_slack.py: the Web API and a Socket Mode
WebSocket server; an unacked envelope is sent again after 3 s, as Slack does), the instant fake model
(tests/fake_models.py: ``echo: <last user text>`` at once), the writer, ``--runners`` runners and the Slack
gateway in Socket Mode, with the production defaults (leases, heartbeats, pacing). This process only plays
the people: it has the fake send their events through its control endpoint.

Load: ``--channels`` conversations (20), each in a channel of its own, alternately a DM (message.im) and a
channel thread (started by a mention of the bot, then replies in the thread without one, the way people
talk to a bot in a channel); each sends one message every ``--period`` s (1.2), the channels' phases spread
evenly over the period: about 16.7 messages/s offered, open loop (a message goes at its time whatever
became of the previous one). Why this load: Slack allows about one chat.postMessage a second per channel
(short bursts tolerated, then 429), and the gateway paces itself to that (services/gateway/slack/outbound.py:
one post per channel per second), so a channel writing faster than once a second would measure the pacing
and a growing backlog, not Starling; at 1.2 s a reply waits for its channel's pace only when its latency
exceeds the previous reply's by more than 0.2 s. Slack has no per-app cap across channels for
chat.postMessage, so the rate in all is limited by the channels' count, not by Slack. An open loop keeps the
offered load constant however slow the system gets, so slowness shows as latency and a backlog (a closed
loop would lower the load instead and hide it).

Latency = the fake's record of the reply's chat.postMessage (``posted`` "time") - the fake's record of the
event's first envelope written to the socket (``envelopes`` "time", attempt 0), both time.time() in the
fake's process. It spans the gateway's read of the envelope, the Inbound write and its commit, the ack,
a runner's claim, the model call, FinishTurn, the gateway's outbox claim, pacing and the chat.postMessage
call. Each reply is matched to its message by text (the model echoes it) and must be in the message's place
(a DM's reply outside any thread, a thread's in its thread). Also: envelope -> ack (the Inbound commit comes
first), and where the time goes, split with the writer's commit times read from the database after the run:
envelope sent -> user turn committed (gateway: read, Inbound), -> answer queued in the outbox (runner),
-> chat.postMessage at the fake (gateway: claim, pacing, call).

``--warmup`` s unmeasured, then ``--seconds`` s measured; then the replies are drained (every message must get
exactly one reply, every envelope must be acked). Figures: latency p50/p90/p99/max of the messages whose
envelope went out in the window; messages/s = replies that arrived in the window / its length; latency
growth = p50 of the window's last third / p50 of its first third; RSS (VmRSS) of each process at the
window's start and end, with its slope over the window; CPU per process and of the machine (other load on
the machine skews every figure). The last line is one JSON object:
{"p50_ms": ..., "p99_ms": ..., "messages_per_s": ..., "latency_growth": ..., "rss_mb": {...}, ...}.
Targets (the issue): p50 < 50 ms, p99 < 250 ms, no growth of latency (growth < 1.5) or of memory (each process
within 10 % + 2 MB of its window-start RSS). Every process is stopped on exit, Ctrl-C or SIGTERM; should this
process die without its cleanup, a reaper process (bench/turns.py's) stops them and removes the home.
This mode runs with ``streaming = "off"``, as the targets were set before drafts existed.

``--stream``: the model streams 200 tokens over 4 s and the instance has ``streaming = "draft"`` (``--drafts
off``: the same model with streaming off, the baseline). ``--channels`` conversations (4), DMs and channel
threads as above, each sending one message every ``--period`` s (6, so an answer is done before the next
message); a draft is one placeholder message posted where the answer goes, then chat.update. Why fewer
conversations: chat.update is tier 3, 50 a minute per workspace for every channel together, and each streamed
answer costs at least one (its placeholder edited into the answer); 4 conversations ask 40 answers a minute,
which leaves about 10 updates a minute for the drafts in between (the gateway gives the first words, the
placeholders, precedence). Beyond that budget answers are posted without drafts, never late. Figures
(bench/gateway_stream.py): message (its envelope sent) -> first visible text (target p50 < 1.5 s), -> the
final message (target p50 < 5 s), the sends per answer, and each answer in exactly one message.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402

from bench import gateway_e2e, gateway_stream, targets  # noqa: E402
from bench.gateway_e2e import (  # noqa: E402
    DRAIN_TIMEOUT_S, BenchStack, Sampler, db_split, headline, judge, percentile, print_resources, progress,
    resources, send_plan, spread,
)

AGENT, INSTANCE = "default", "sl"


def conversations(count: int) -> list[str]:
    """The channels, one conversation each: even ones DMs, odd ones channels (a thread there)."""
    return [f"D0B{i:03d}" if i % 2 == 0 else f"C0B{i:03d}" for i in range(count)]


def user_of(channel: str) -> str:
    return "U0B" + channel[3:]


def config_text(model_url: str, api_base: str, channels: list[str], runners: int, streaming: str = "off") -> str:
    return (
        f"[runner]\nprocesses = {runners}\n"
        "[providers.default]\n"
        f'kind = "openai"\nbase_url = "{model_url}"\napi_key = "openai"\nmodel = "fake-model"\n'
        "context_window = 128000\n"
        f'[[gateways.slack]]\nid = "{INSTANCE}"\nagent = "{AGENT}"\nmode = "socket"\nbot_token = "slack-bot"\n'
        f'app_token = "slack-app"\napi_base = "{api_base}"\n'
        f"allow = {json.dumps([user_of(c) for c in channels])}\nstreaming = \"{streaming}\"\n"
    )


def message(channel: str, n: int) -> str:
    return f"channel {channel} #{n}: should the tomatoes go next to the basil this week?"


# ---------------------------------------------------------------- the stack


class Stack(BenchStack):
    """bench/gateway_e2e.py's stack around the fake Slack and the Slack gateway in Socket Mode; ready once the
    gateway's WebSocket is up."""

    service = "gateway.slack"
    fake_label = "fake slack"
    reaper_name = "slack bench reaper"

    @property
    def sl(self):
        return self.fake

    def start_fake(self, root: Path):
        from tests.fake_slack import FakeSlackProcess

        return FakeSlackProcess(root / "fake-slack", lifetime=3600).start()

    streaming = "off"

    def config_text(self, model_url: str) -> str:
        return config_text(model_url, self.fake.api_base, conversations(self.chats), len(self.names), self.streaming)

    def secrets(self) -> dict[str, str]:
        from tests.fake_slack import DEFAULT

        return {"slack-bot": DEFAULT["bot_token"], "slack-app": DEFAULT["app_token"]}

    def connected(self) -> bool:
        return any(c["closed"] is None and c.get("num_connections") for c in self.fake.records("connections"))


# ---------------------------------------------------------------- the people


class Records:
    """The fake's records of envelopes, acks and posts, read incrementally (they are bounded there)."""

    def __init__(self, sl) -> None:
        self.sl = sl
        self.envelopes: dict[str, dict] = {}       # envelope_id -> record (each attempt its own)
        self.acks: dict[str, dict] = {}            # envelope_id -> first ack
        self.posted: dict[tuple[str, str], dict] = {}  # (channel, ts) -> record
        self._since = 0.0

    def fetch(self) -> None:
        since = self._since
        now = time.time()
        for rec in self.sl.records("envelopes", since=since):
            self.envelopes[rec["envelope_id"]] = rec
        for rec in self.sl.records("acks", since=since):
            self.acks.setdefault(rec["envelope_id"], rec)
        for rec in self.sl.records("posted", since=since):
            self.posted[(rec["channel"], rec["ts"])] = rec
        self._since = now - 1.0  # overlapping windows; records are keyed, so read twice is kept once


def schedule(args, channels: list[str]) -> tuple[float, float, float, list[tuple[float, str, int]]]:
    """The run's start, its measured window (w0, w1) and every conversation's sends, spread over a period."""
    start = time.time() + 0.2
    w0, w1 = start + args.warmup, start + args.warmup + args.seconds
    plan = sorted((start + k * args.period + i * args.period / len(channels), channel, k)
                  for i, channel in enumerate(channels)
                  for k in range(int((args.warmup + args.seconds) / args.period) + 1))
    return start, w0, w1, [p for p in plan if p[0] < w1]


def post(stack: Stack, threads: dict[str, str], channel: str, text: str) -> dict:
    """One message into its conversation: a DM, a mention that starts the channel's thread, or a reply in it."""
    if channel.startswith("D"):
        return stack.sl.message(channel, user_of(channel), text, channel_type="im")
    if channel not in threads:
        env = stack.sl.app_mention(channel, user_of(channel), text)
        threads[channel] = env["payload"]["event"]["ts"]
        return env
    return stack.sl.message(channel, user_of(channel), text, thread_ts=threads[channel], channel_type="channel")


def drive(stack: Stack, args) -> dict:
    """Send the conversations' events on schedule for warmup + seconds, then drain. Times are time.time()."""
    records = Records(stack.sl)
    sampler = Sampler(stack, records)
    sampler.sample()
    idle_rss = {name: points[-1][1] for name, points in sampler.rss.items() if points}
    channels = conversations(args.channels)
    events: dict[str, tuple[str, str, str | None]] = {}  # event_id -> (channel, text, thread_ts to answer in)
    threads: dict[str, str] = {}  # channel -> its thread's ts
    start, w0, w1, plan = schedule(args, channels)

    def send(channel: str, k: int) -> None:
        text = message(channel, k)
        env = post(stack, threads, channel, text)
        events[env["payload"]["event_id"]] = (channel, text, threads.get(channel))

    sent = send_plan(stack, sampler, plan, send, w0, w1)
    stack.check_alive()
    # drain: every message answered and every envelope acked, or the timeout
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        records.fetch()
        answered = {r["text"] for r in records.posted.values()}
        missing = [e for e, (_, text, _) in events.items() if "echo: " + text not in answered]
        if (not missing and not stack.sl.pending()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    time.sleep(1.0)  # a late duplicate would show
    records.fetch()
    return {"records": records, "events": events, "w0": w0, "w1": w1, "start": start, "rss": sampler.rss,
            "idle_rss": idle_rss, "unacked": len(stack.sl.pending()), "expired": len(stack.sl.records("expired")),
            "reactions": len([r for r in stack.sl.records("reactions") if w0 <= r["time"] < w1]), **sent}


class _NoRecords:
    def fetch(self) -> None:
        pass


def drive_stream(stack: Stack, args) -> int:
    """--stream: the conversations' events on schedule, then the answers read back and judged."""
    sampler = Sampler(stack, _NoRecords())  # RSS only: the records are read once, at the end
    channels = conversations(args.channels)
    events: dict[str, tuple[str, str, str]] = {}  # event_id -> (conversation, text, kind)
    threads: dict[str, str] = {}
    start, w0, w1, plan = schedule(args, channels)

    def send(channel: str, k: int) -> None:
        text = message(channel, k)
        env = post(stack, threads, channel, text)
        events[env["payload"]["event_id"]] = (channel, text, "dm" if channel.startswith("D") else "thread")

    send_plan(stack, sampler, plan, send, w0, w1)
    stack.check_alive()
    answers = {gateway_stream.answer_of(t) for _, t, _ in events.values()}
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        finals = {r["text"] for kind in ("posted", "updates") for r in stack.sl.records(kind, since=start - 1)}
        if answers <= finals:
            break
        time.sleep(0.5)
    time.sleep(1.5)  # a late draft or a second answer would show
    sent_at: dict[str, float] = {}
    for env in stack.sl.records("envelopes", since=start - 1):
        if env.get("attempt", 0) == 0 and env.get("event_id"):
            sent_at.setdefault(env["event_id"], env["time"])
    asked = [gateway_stream.Asked(channel, text, sent_at.get(event_id, 0.0), kind)
             for event_id, (channel, text, kind) in events.items()]
    shown: dict[str, list[gateway_stream.Shown]] = {}
    for kind, what in (("posted", "post"), ("updates", "edit")):
        for r in stack.sl.records(kind, since=start - 1):
            shown.setdefault(r["channel"], []).append(gateway_stream.Shown(r["time"], r["ts"], r["text"] or "", what))
    figures, met, ok = gateway_stream.report(gateway_stream.measure(asked, shown), w0, w1, args.drafts == "on",
                                             f"{len(channels)} conversations (DMs and channel threads), one"
                                             f" message each every {args.period:g} s")
    if args.keep:
        print(f"kept: home {stack.home.root}")
    return targets.last_line({**figures, "channels": args.channels, "seconds": args.seconds}, met, checks_ok=ok)


# ---------------------------------------------------------------- report

SPLIT = ("envelope -> user turn committed (gateway: read, Inbound)",
         "-> answer queued (runner: claim, model, FinishTurn)",
         "-> chat.postMessage at the fake (gateway: claim, pacing, call)")


def analyse(stack: Stack, run: dict) -> dict:
    records, events, w0, w1 = run["records"], run["events"], run["w0"], run["w1"]
    first_envelope: dict[str, dict] = {}
    for rec in records.envelopes.values():
        if rec["attempt"] == 0 and rec["event_id"]:
            first_envelope[rec["event_id"]] = rec
    by_text: dict[str, list[dict]] = {}
    for rec in sorted(records.posted.values(), key=lambda r: r["time"]):
        by_text.setdefault(rec["text"], []).append(rec)
    latency, acked, thirds, missing, wrong_place = [], [], ([], [], []), [], []
    split = {label: [] for label in SPLIT}
    commits = db_split(stack, INSTANCE, run["start"] - 1)
    third = (w1 - w0) / 3
    for event_id, (channel, text, thread_ts) in events.items():
        posts = by_text.get("echo: " + text)
        env = first_envelope.get(event_id)
        if not posts or env is None:
            missing.append(text)
            continue
        if (posts[0]["channel"], posts[0]["thread_ts"]) != (channel, thread_ts):
            wrong_place.append(text)
        sent_at = env["time"]
        if not w0 <= sent_at < w1:
            continue
        ms = (posts[0]["time"] - sent_at) * 1000
        latency.append(ms)
        thirds[min(2, int((sent_at - w0) // third))].append(ms)
        ack = records.acks.get(env["envelope_id"])
        if ack is not None:
            acked.append((ack["time"] - sent_at) * 1000)
        c = commits.get(text)
        if c is not None:
            split[SPLIT[0]].append((c[0] - sent_at) * 1000)
            split[SPLIT[1]].append((c[1] - c[0]) * 1000)
            split[SPLIT[2]].append((posts[0]["time"] - c[1]) * 1000)
    duplicates = sum(len(v) - 1 for v in by_text.values() if len(v) > 1)
    ours = {"echo: " + text for _, text, _ in events.values()}
    strays = [t for t in by_text if t not in ours]
    in_window = sum(1 for rec in records.posted.values() if w0 <= rec["time"] < w1)
    redelivered = sum(1 for rec in records.envelopes.values() if rec["attempt"] > 0)
    p50s = [percentile(sorted(t), 50) for t in thirds]
    return {"latency": latency, "acked": acked, "thirds": thirds, "p50s": p50s, "split": split, "missing": missing,
            "wrong_place": wrong_place, "duplicates": duplicates, "strays": strays, "in_window": in_window,
            "redelivered": redelivered, **resources(run),
            "growth": p50s[2] / p50s[0] if p50s[0] > 0 else float("inf")}


def report(args, stack: Stack, run: dict, res: dict) -> int:
    lat = sorted(res["latency"])
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    rate = res["in_window"] / args.seconds
    offered = args.channels / args.period
    dms = sum(c.startswith("D") for c in conversations(args.channels))
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load avg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"processes: fake Slack (Web API + Socket Mode), instant fake model, writer, {len(stack.names)} runners,"
          " gateway-slack (Socket Mode); this process has the fake send the people's events")
    print(f"load: {args.channels} channels ({dms} DMs, {args.channels - dms} channel threads started by a mention),"
          f" one message each every {args.period:g}s (open loop, phases spread): {offered:.1f} messages/s offered;"
          f" {args.warmup:g}s warm-up, {args.seconds:g}s measured")
    late = sorted(x * 1000 for x in run["lag"])
    print(f"  this process sent {len(run['events'])} events; its lateness against the plan:"
          f" p50 {percentile(late, 50):.1f}  max {late[-1] if late else 0:.1f} ms")
    print("latency = chat.postMessage arriving at the fake - the envelope sent on the socket (both the fake's clock):")
    print(f"  all messages sent in the window: {spread(res['latency'])}")
    for i, name in enumerate(("first", "middle", "last")):
        print(f"  {name:6s} third: {spread(res['thirds'][i])}")
    print(f"  growth (p50 last third / first third): {res['growth']:.2f}")
    print(f"  envelope -> its ack at the fake (after the writer's commit): {spread(res['acked'])}")
    print("  where the time goes (the writer's commit times):")
    for label, values in res["split"].items():
        print(f"    {label:62s} {spread(values)}")
    print(f"throughput: {rate:.1f} replies/s arrived in the window ({res['in_window']} replies);"
          f" working reactions in the window: {run['reactions']}; envelopes sent again (not acked in 3 s):"
          f" {res['redelivered']}; unacked at the end: {run['unacked']}; expired: {run['expired']}")
    print_resources(res)
    ok = not (res["missing"] or res["duplicates"] or res["strays"] or res["wrong_place"] or run["unacked"]
              or run["expired"])
    print(f"answers checked: {'OK' if ok else 'MISMATCH'} ({len(run['events'])} messages; missing"
          f" {len(res['missing'])}, duplicates {res['duplicates']}, strays {len(res['strays'])},"
          f" in the wrong place {len(res['wrong_place'])}; envelopes unacked {run['unacked']},"
          f" expired {run['expired']})")
    for text in res["missing"][:5]:
        print(f"  unanswered: {text}")
    procs = [n for n in res["rss"] if n in stack.procs()]
    met = judge(res, p50, p99, procs)
    if args.keep:
        print(f"kept: home {stack.home.root}")
    acked = sorted(res["acked"])
    return targets.last_line({
        **headline(res, lat, rate, offered, procs, ack_p50_ms=round(percentile(acked, 50), 1),
                   ack_p99_ms=round(percentile(acked, 99), 1)),
        "channels": args.channels,
        "seconds": args.seconds,
        "messages": len(run["events"]),
        "duplicates": res["duplicates"],
        "missing": len(res["missing"]),
        "redelivered": res["redelivered"],
        "answers_ok": ok,
    }, met, checks_ok=ok)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument("--channels", type=int,
                        help="conversations, each in a channel of its own: alternately a DM and a channel thread"
                             " (20; --stream: 4)")
    parser.add_argument("--period", type=float, help="seconds between one channel's messages (1.2; --stream: 6)")
    parser.add_argument("--stream", action="store_true", help="a model streaming 200 tokens over 4 s, drafts shown")
    parser.add_argument("--drafts", choices=("on", "off"), default="on", help="--stream: streaming draft or off")
    parser.add_argument("--runners", type=int, default=2, help="runner processes (the default config's 2)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (printed)")
    args = parser.parse_args(argv)
    args.channels = args.channels if args.channels is not None else (4 if args.stream else 20)
    args.period = args.period if args.period is not None else (6.0 if args.stream else 1.2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not 1 <= args.channels <= 999 or args.seconds <= 0 or args.warmup < 0 or args.period <= 0 \
            or args.runners < 1:
        print("--channels must be 1..999; --seconds, --period and --runners positive, --warmup not negative",
              file=sys.stderr)
        return 2

    def body(stack: Stack) -> int:
        progress(f"running: {args.warmup:g}s warm-up, {args.seconds:g}s measured, then the drain")
        if args.stream:
            return drive_stream(stack, args)
        run = drive(stack, args)
        progress("reading the results")
        return report(args, stack, run, analyse(stack, run))

    stack = Stack(args.channels, args.runners)
    if args.stream:
        stack.pace = gateway_stream.PACE
        stack.streaming = "draft" if args.drafts == "on" else "off"
    return gateway_e2e.run(args, stack, body)


if __name__ == "__main__":
    gateway_e2e.main_guard(main)
