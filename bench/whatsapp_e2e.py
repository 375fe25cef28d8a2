"""WhatsApp end-to-end benchmark: from Meta's webhook POST of a message to its reply's send call
(POST /{phone-number-id}/messages) arriving at the Graph API.

    python bench/whatsapp_e2e.py [--seconds 30] [--warmup 5] [--numbers 20] [--period 1.2] [--runners 2]
                                 [--webhook-concurrency 4] [--keep]
    python -m bench.whatsapp_e2e ...

Processes, each its own as in production: the fake Cloud API (tests/fake_whatsapp.py: the Graph API, and
Meta's webhook sender, which posts each inbound message signed with X-Hub-Signature-256 to the gateway and
retries a non-2xx or missing answer), the instant fake model (tests/fake_models.py: ``echo: <last user
text>`` at once), the writer, ``--runners`` runners and the WhatsApp gateway on the Cloud API (its webhook
server on 127.0.0.1), with the production defaults (leases, heartbeats, pacing). The gateway must pass
Meta's GET verification (hub.verify_token, hub.challenge) before the run starts. This process only plays
the people: it has the fake queue their messages for webhook delivery through its control endpoint.

Load: ``--numbers`` people (20), each a WhatsApp number of its own, all allowed, each sending one message
every ``--period`` s (1.2), the numbers' phases spread evenly over the period: about 16.7 messages/s
offered, open loop (a message goes at its time whatever became of the previous one). Why this load: it is
bench/telegram_e2e.py's (the issue sets the same targets), so the figures compare across platforms.
WhatsApp's own limits are looser for this: the Cloud API takes 80 messages/s per business number by default,
and the gateway paces itself to that (services/gateway/whatsapp/outbound.py) and to 20 a second per
recipient. Meta's pair rate limit (about one message every 6 s to one person, with bursts allowed) would,
over minutes, throttle a person writing every 1.2 s; the fake does not enforce it here, because this
measures Starling, not Meta's pacing. The fake posts up to ``--webhook-concurrency`` (4) webhooks at once,
as Meta delivers in parallel; one number's messages are 1.2 s apart, so they never overtake each other. An
open loop keeps the offered load constant however slow the system gets, so slowness shows as latency and a
backlog (a closed loop would lower the load instead and hide it).

Latency = the fake's record of the reply's send call (``sent`` "ts") - the start of the message's webhook
POST (its ``deliveries`` record: "ts", when the answer came, less "elapsed", how long the POST took), both
time.time() in the fake's process. It spans the gateway's signature check and parse, the Inbound write and
its commit, the 200, a runner's claim, the model call, FinishTurn, the gateway's outbox claim, pacing and the
send call. The time a message waited in the fake's queue before its POST (``injected`` -> POST start) is
the fake's, not Starling's, and is shown apart. Each reply is matched to its message by text (the model
echoes it) and must go to the number that wrote. Also: POST -> its 200 (the Inbound commit comes first), and
where the time goes, split with the writer's commit times read from the database after the run: POST ->
user turn committed (gateway: verify, parse, Inbound), -> answer queued in the outbox (runner), -> the send
call at the fake (gateway: claim, pacing, call).

``--warmup`` s unmeasured, then ``--seconds`` s measured; then the replies are drained (every message must get
exactly one reply, every webhook must end answered 200). Figures: latency p50/p90/p99/max of the messages
whose webhook POST began in the window; messages/s = replies that arrived in the window / its length;
latency growth = p50 of the window's last third / p50 of its first third; RSS (VmRSS) of each process at the
window's start and end, with its slope over the window; CPU per process and of the machine (other load on
the machine skews every figure). The last line is one JSON object:
{"p50_ms": ..., "p99_ms": ..., "messages_per_s": ..., "latency_growth": ..., "rss_mb": {...}, ...}.
Targets (the issue): p50 < 50 ms, p99 < 250 ms, no growth of latency (growth < 1.5) or of memory (each process
within 10 % + 2 MB of its window-start RSS). Every process is stopped on exit, Ctrl-C or SIGTERM; should this
process die without its cleanup, a reaper process (bench/turns.py's) stops them and removes the home.
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
import socket  # noqa: E402
import time  # noqa: E402

from bench import gateway_e2e, targets  # noqa: E402
from bench.gateway_e2e import (  # noqa: E402
    DRAIN_TIMEOUT_S, BenchStack, Sampler, db_split, headline, judge, percentile, print_resources, progress,
    resources, send_plan, spread,
)

AGENT, INSTANCE = "default", "wa"
FIRST_NUMBER = 4915200000000


def numbers(count: int) -> list[str]:
    """The people's numbers as WhatsApp's wa_id spells them (E.164 digits); each is a chat of its own."""
    return [str(FIRST_NUMBER + i) for i in range(count)]


def config_text(model_url: str, api_base: str, listen: str, people: list[str], runners: int) -> str:
    from tests.fake_whatsapp import DEFAULT_PHONE_NUMBER_ID

    return (
        f"[runner]\nprocesses = {runners}\n"
        "[providers.default]\n"
        f'kind = "openai"\nbase_url = "{model_url}"\napi_key = "openai"\nmodel = "fake-model"\n'
        "context_window = 128000\n"
        f'[[gateways.whatsapp]]\nid = "{INSTANCE}"\nagent = "{AGENT}"\nmode = "cloud"\n'
        f'phone_number_id = "{DEFAULT_PHONE_NUMBER_ID}"\napi_base = "{api_base}"\nlisten = "{listen}"\n'
        f"allow = {json.dumps(['+' + n for n in people])}\n"
    )


def message(number: str, n: int) -> str:
    return f"number {number} #{n}: should the tomatoes go next to the basil this week?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the stack


class Stack(BenchStack):
    """bench/gateway_e2e.py's stack around the fake Cloud API and the WhatsApp gateway's webhook; ready once
    Meta's GET verification passes."""

    service = "gateway.whatsapp"
    fake_label = "fake whatsapp"
    reaper_name = "whatsapp bench reaper"

    def __init__(self, chats: int, runners: int, webhook_concurrency: int) -> None:
        super().__init__(chats, runners)
        self.listen = f"127.0.0.1:{free_port()}"
        self.webhook = f"http://{self.listen}/whatsapp/{INSTANCE}/webhook"
        self.webhook_concurrency = webhook_concurrency
        self.verified = False

    @property
    def wa(self):
        return self.fake

    def start_fake(self, root: Path):
        from tests.fake_whatsapp import DEFAULT_APP_SECRET, FakeWhatsAppProcess

        fake = FakeWhatsAppProcess(root / "fake-wa", webhook=self.webhook, app_secret=DEFAULT_APP_SECRET,
                                   lifetime=3600).start()
        fake.configure(webhook_concurrency=self.webhook_concurrency)
        return fake

    def config_text(self, model_url: str) -> str:
        return config_text(model_url, self.fake.api_base, self.listen, numbers(self.chats), len(self.names))

    def secrets(self) -> dict[str, str]:
        from tests.fake_whatsapp import DEFAULT_APP_SECRET, DEFAULT_TOKEN, DEFAULT_VERIFY_TOKEN

        return {"whatsapp-token": DEFAULT_TOKEN, "whatsapp-app-secret": DEFAULT_APP_SECRET,
                "whatsapp-verify": DEFAULT_VERIFY_TOKEN}

    def connected(self) -> bool:
        if not self.verified:
            got = self.fake.verify(self.webhook, challenge="1158201444")
            self.verified = got["status"] == 200 and got["body"] == "1158201444"
        return self.verified


# ---------------------------------------------------------------- the people


class Records:
    """The fake's records of queued messages, webhook attempts, sends and read receipts, read incrementally
    (they are bounded there)."""

    def __init__(self, wa) -> None:
        self.wa = wa
        self.injected: dict[str, float] = {}                  # wamid -> ts (queued for delivery)
        self.deliveries: dict[tuple[str, int, int], dict] = {}  # (wamid, copy, attempt) -> record
        self.sent: dict[str, dict] = {}                       # the reply's wamid -> record
        self.reads: dict[tuple[str, bool], dict] = {}         # (message_id, typing) -> first record
        self._since = 0.0

    def fetch(self) -> None:
        since = self._since
        now = time.time()
        for rec in self.wa.records("injected", since=since):
            self.injected[rec["wamid"]] = rec["ts"]
        for rec in self.wa.deliveries(since=since):
            for wamid in rec.get("wamids") or []:
                self.deliveries[(wamid, rec["copy"], rec["attempt"])] = rec
        for rec in self.wa.sent(since=since):
            self.sent[rec["id"]] = rec
        for rec in self.wa.records("reads", since=since):
            self.reads.setdefault((rec["message_id"], rec["typing"]), rec)
        self._since = now - 1.0  # overlapping windows; records are keyed, so read twice is kept once


def drive(stack: Stack, args) -> dict:
    """Queue the numbers' messages on schedule for warmup + seconds, then drain. Times are time.time()."""
    records = Records(stack.wa)
    sampler = Sampler(stack, records)
    sampler.sample()
    idle_rss = {name: points[-1][1] for name, points in sampler.rss.items() if points}
    people = numbers(args.numbers)
    texts: dict[str, tuple[str, str]] = {}  # wamid -> (number, text)
    start = time.time() + 0.2
    w0, w1 = start + args.warmup, start + args.warmup + args.seconds
    plan = sorted((start + k * args.period + i * args.period / len(people), number, k)
                  for i, number in enumerate(people)
                  for k in range(int((args.warmup + args.seconds) / args.period) + 1))
    plan = [p for p in plan if p[0] < w1]

    def send(number: str, k: int) -> None:
        text = message(number, k)
        texts[stack.wa.message(number, text)["wamid"]] = (number, text)

    sent = send_plan(stack, sampler, plan, send, w0, w1)
    stack.check_alive()
    # drain: every message answered and every webhook delivered, or the timeout
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        records.fetch()
        answered = {r["text"] for r in records.sent.values()}
        missing = [w for w, (_, text) in texts.items() if "echo: " + text not in answered]
        if (not missing and not stack.wa.pending()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    time.sleep(1.0)  # a late duplicate would show
    records.fetch()
    return {"records": records, "texts": texts, "w0": w0, "w1": w1, "start": start, "rss": sampler.rss,
            "idle_rss": idle_rss, "undelivered": stack.wa.pending(), **sent}


# ---------------------------------------------------------------- report

SPLIT = ("webhook POST -> user turn committed (gateway: signature, parse, Inbound)",
         "-> answer queued (runner: claim, model, FinishTurn)",
         "-> send call at the fake (gateway: claim, pacing, call)")


def analyse(stack: Stack, run: dict) -> dict:
    records, texts, w0, w1 = run["records"], run["texts"], run["w0"], run["w1"]
    attempts: dict[str, list[dict]] = {}
    for (wamid, _copy, _attempt), rec in records.deliveries.items():
        attempts.setdefault(wamid, []).append(rec)
    by_text: dict[str, list[dict]] = {}
    for rec in sorted(records.sent.values(), key=lambda r: r["ts"]):
        by_text.setdefault(rec["text"], []).append(rec)
    latency, acked, queued, thirds, missing, wrong_number, unacked = [], [], [], ([], [], []), [], [], []
    split = {label: [] for label in SPLIT}
    commits = db_split(stack, INSTANCE, run["start"] - 1)
    third = (w1 - w0) / 3
    for wamid, (number, text) in texts.items():
        sent = by_text.get("echo: " + text)
        tries = sorted(attempts.get(wamid, []), key=lambda r: r["ts"])
        ok = [r for r in tries if r["status"] == 200]
        if not ok:
            unacked.append(text)
        if not sent or not tries:
            missing.append(text)
            continue
        if sent[0]["wa_id"] != number:
            wrong_number.append(text)
        post = tries[0]["ts"] - tries[0]["elapsed"]  # the first attempt's start
        if not w0 <= post < w1:
            continue
        ms = (sent[0]["ts"] - post) * 1000
        latency.append(ms)
        thirds[min(2, int((post - w0) // third))].append(ms)
        if ok:
            acked.append((ok[0]["ts"] - post) * 1000)
        if wamid in records.injected:
            queued.append((post - records.injected[wamid]) * 1000)
        c = commits.get(text)
        if c is not None:
            split[SPLIT[0]].append((c[0] - post) * 1000)
            split[SPLIT[1]].append((c[1] - c[0]) * 1000)
            split[SPLIT[2]].append((sent[0]["ts"] - c[1]) * 1000)
    duplicates = sum(len(v) - 1 for v in by_text.values() if len(v) > 1)
    ours = {"echo: " + text for _, text in texts.values()}
    strays = [t for t in by_text if t not in ours]
    in_window = sum(1 for rec in records.sent.values() if w0 <= rec["ts"] < w1)
    redelivered = sum(1 for rec in records.deliveries.values() if rec["attempt"] > 1 or rec["copy"] > 0)
    refused = sum(1 for rec in records.deliveries.values() if rec["status"] != 200)
    marked_read = {mid for (mid, typing) in records.reads if not typing}
    reads_in_window = sum(1 for rec in records.reads.values() if w0 <= rec["ts"] < w1)
    p50s = [percentile(sorted(t), 50) for t in thirds]
    return {"latency": latency, "acked": acked, "queued": queued, "thirds": thirds, "p50s": p50s, "split": split,
            "missing": missing, "wrong_number": wrong_number, "unacked": unacked, "duplicates": duplicates,
            "strays": strays, "in_window": in_window, "redelivered": redelivered, "refused": refused,
            "unread": sum(1 for w in texts if w not in marked_read), "reads_in_window": reads_in_window,
            **resources(run), "growth": p50s[2] / p50s[0] if p50s[0] > 0 else float("inf")}


def report(args, stack: Stack, run: dict, res: dict) -> int:
    lat = sorted(res["latency"])
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    rate = res["in_window"] / args.seconds
    offered = args.numbers / args.period
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load avg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"processes: fake WhatsApp (Graph API + Meta's signed webhooks, up to {args.webhook_concurrency} at once),"
          f" instant fake model, writer, {len(stack.names)} runners, gateway-whatsapp (Cloud API webhook); this"
          " process has the fake send the people's messages")
    print(f"load: {args.numbers} numbers, one message each every {args.period:g}s (open loop, phases spread):"
          f" {offered:.1f} messages/s offered; {args.warmup:g}s warm-up, {args.seconds:g}s measured")
    late = sorted(x * 1000 for x in run["lag"])
    print(f"  this process queued {len(run['texts'])} messages; its lateness against the plan:"
          f" p50 {percentile(late, 50):.1f}  max {late[-1] if late else 0:.1f} ms")
    print("latency = the reply's send call arriving at the fake - the message's webhook POST beginning (both the"
          " fake's clock):")
    print(f"  all messages posted in the window: {spread(res['latency'])}")
    for i, name in enumerate(("first", "middle", "last")):
        print(f"  {name:6s} third: {spread(res['thirds'][i])}")
    print(f"  growth (p50 last third / first third): {res['growth']:.2f}")
    print(f"  webhook POST -> its 200 at the fake (after the writer's commit): {spread(res['acked'])}")
    print(f"  (not in the latency: queued at the fake -> its POST began: {spread(res['queued'])})")
    print("  where the time goes (the writer's commit times):")
    for label, values in res["split"].items():
        print(f"    {label:72s} {spread(values)}")
    print(f"throughput: {rate:.1f} replies/s arrived in the window ({res['in_window']} replies); read receipts"
          f" in the window: {res['reads_in_window']}; messages never marked read: {res['unread']}; webhook attempts"
          f" not answered 200: {res['refused']}; posted again: {res['redelivered']}; undelivered at the end:"
          f" {run['undelivered']}")
    print_resources(res)
    ok = not (res["missing"] or res["duplicates"] or res["strays"] or res["wrong_number"] or res["unacked"]
              or run["undelivered"])
    print(f"answers checked: {'OK' if ok else 'MISMATCH'} ({len(run['texts'])} messages; missing"
          f" {len(res['missing'])}, duplicates {res['duplicates']}, strays {len(res['strays'])},"
          f" to the wrong number {len(res['wrong_number'])}; webhooks never answered 200 {len(res['unacked'])},"
          f" undelivered {run['undelivered']})")
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
        "numbers": args.numbers,
        "seconds": args.seconds,
        "messages": len(run["texts"]),
        "duplicates": res["duplicates"],
        "missing": len(res["missing"]),
        "webhooks_refused": res["refused"],
        "answers_ok": ok,
    }, met, checks_ok=ok)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument("--numbers", type=int, default=20, help="people, each writing from a number of their own")
    parser.add_argument("--period", type=float, default=1.2, help="seconds between one number's messages")
    parser.add_argument("--runners", type=int, default=2, help="runner processes (the default config's 2)")
    parser.add_argument("--webhook-concurrency", type=int, default=4,
                        help="webhook POSTs the fake makes at once (1..16; Meta delivers in parallel)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (printed)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not 1 <= args.numbers <= 999 or args.seconds <= 0 or args.warmup < 0 or args.period <= 0 \
            or args.runners < 1 or not 1 <= args.webhook_concurrency <= 16:
        print("--numbers must be 1..999, --webhook-concurrency 1..16; --seconds, --period and --runners positive,"
              " --warmup not negative", file=sys.stderr)
        return 2

    def body(stack: Stack) -> int:
        progress(f"running: {args.warmup:g}s warm-up, {args.seconds:g}s measured, then the drain")
        run = drive(stack, args)
        progress("reading the results")
        return report(args, stack, run, analyse(stack, run))

    return gateway_e2e.run(args, Stack(args.numbers, args.runners, args.webhook_concurrency), body)


if __name__ == "__main__":
    gateway_e2e.main_guard(main)
