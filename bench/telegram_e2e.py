"""Telegram end-to-end benchmark: from an update queued at the Bot API to its reply's sendMessage arriving there.

    python bench/telegram_e2e.py [--seconds 30] [--warmup 5] [--chats 20] [--period 1.2] [--runners 2] [--keep]
    python bench/telegram_e2e.py --stream [--drafts on|off] [--chats 10] [--period 6] ...
    python -m bench.telegram_e2e ...

Processes, each its own as in production: the fake Bot API (tests/fake_telegram.py), the instant fake model
(tests/fake_models.py: ``echo: <last user text>`` at once), the writer, ``--runners`` runners and the Telegram
gateway in long-polling mode, with the production defaults (leases, heartbeats, pacing). This process only
plays the people: it queues their messages at the fake through its control endpoint.

Load: ``--chats`` private chats (20), each sending one message every ``--period`` s (1.2), the chats' phases
spread evenly over the period: about 16.7 messages/s offered, open loop (a message goes at its time whatever
became of the previous one). Why this load: Telegram lets a bot send about one message a second to a chat and
30 a second in all, and the gateway paces itself to that (services/gateway/limits.py), so a chat writing faster
than once a second would measure the pacing, not Starling; at 1.2 s a reply waits for its chat's pace only when
its latency exceeds the previous reply's by more than 0.2 s. 20 chats at that rate stay under the 30 a second
a bot may send. An open loop keeps the offered load constant however slow the system gets, so slowness shows
as latency and a backlog (a closed loop would lower the load instead and hide it).

Latency = the fake's record of the reply's sendMessage (``sent()["ts"]``) - the fake's record of queuing the
update (``injected()["ts"]``), both time.time() in the fake's process. It spans the gateway's long poll, the
Inbound write and its commit, a runner's claim, the model call, FinishTurn, the gateway's outbox claim, pacing
and the sendMessage call. Each reply is matched to its message by text (the model echoes it). Where the time
goes is split with the writer's commit times read from the database after the run: queued -> user turn
committed (poll + Inbound), -> answer queued in the outbox (runner), -> sendMessage at the fake (delivery).

``--warmup`` s unmeasured, then ``--seconds`` s measured; then the replies are drained (every message must get
exactly one reply). Figures: latency p50/p90/p99/max of the messages queued in the window; messages/s = replies
that arrived in the window / its length; latency growth = p50 of the window's last third / p50 of its first
third; RSS (VmRSS) of each process at the window's start and end, with its slope over the window; CPU per
process and of the machine (other load on the machine skews every figure). The last line is one JSON object:
{"p50_ms": ..., "p99_ms": ..., "messages_per_s": ..., "latency_growth": ..., "rss_mb": {...}, ...}.
Targets (the issue): p50 < 50 ms, p99 < 250 ms, no growth of latency (growth < 1.5) or of memory (each process
within 10 % + 2 MB of its window-start RSS). Every process is stopped on exit, Ctrl-C or SIGTERM; should this
process die without its cleanup, a reaper process (bench/turns.py's) stops them and removes the home.
This mode runs with ``streaming = "off"``, as the targets were set before drafts existed.

``--stream``: the model streams 200 tokens over 4 s and the instance has ``streaming = "draft"`` (``--drafts
off``: the same model with streaming off, the baseline). ``--chats`` conversations (10), alternately a private
chat (drafts by sendMessageDraft) and a group (the bot mentioned; one placeholder message edited), each
sending one message every ``--period`` s (6, so an answer is done before the next message). Figures
(bench/gateway_stream.py): message -> first visible text (target p50 < 1.5 s), -> the final message (target
p50 < 5 s: the model's 4 s and 1 s), the sends per answer, and each answer in exactly one message.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

from bench import gateway_e2e, gateway_stream, targets  # noqa: E402
from bench.gateway_e2e import (  # noqa: E402, F401  (the names this module had before they were shared)
    DRAIN_TIMEOUT_S, FETCH_EVERY_S, READY_TIMEOUT_S, RSS_EVERY_S, TARGETS, BenchStack, Sampler, percentile,
    headline, judge, print_resources, progress, resources, rss_mb, rss_ok, send_plan, slope_per_min, spread,
)

AGENT, INSTANCE = "default", "tg"
FIRST_USER = 2001


def config_text(model_url: str, tg_url: str, chats: int, runners: int, streaming: str = "off") -> str:
    users = ", ".join(str(x) for i in range(chats) for x in (FIRST_USER + i, group_of(FIRST_USER + i)))
    return (
        f"[runner]\nprocesses = {runners}\n"
        "[providers.default]\n"
        f'kind = "openai"\nbase_url = "{model_url}"\napi_key = "openai"\nmodel = "fake-model"\n'
        "context_window = 128000\n"
        f'[[gateways.telegram]]\nid = "{INSTANCE}"\nagent = "{AGENT}"\ntoken = "tg-token"\nmode = "polling"\n'
        f'api_base = "{tg_url}"\nallow = [{users}]\nstreaming = "{streaming}"\n'
    )


def group_of(user: int) -> int:
    return -1_000_000_000_000 - user  # a supergroup's id (--stream: every other conversation)


def message(chat: int, n: int) -> str:
    return f"chat {chat} #{n}: should the tomatoes go next to the basil this week?"


# ---------------------------------------------------------------- the stack


class Stack(BenchStack):
    """bench/gateway_e2e.py's stack around the fake Bot API and the Telegram gateway in long-polling mode."""

    service = "gateway.telegram"
    fake_label = "fake bot api"
    reaper_name = "telegram bench reaper"

    @property
    def tg(self):
        return self.fake

    def start_fake(self, root: Path):
        from tests.fake_telegram import FakeTelegramProcess

        return FakeTelegramProcess(root / "fake-tg", lifetime=3600).start()

    streaming = "off"

    def config_text(self, model_url: str) -> str:
        return config_text(model_url, self.fake.url, self.chats, len(self.names), self.streaming)

    def secrets(self) -> dict[str, str]:
        from tests.fake_telegram import DEFAULT_TOKEN

        return {"tg-token": DEFAULT_TOKEN}


# ---------------------------------------------------------------- the people


class Records:
    """The fake's records of queued updates and sent messages, read incrementally (they are bounded there)."""

    def __init__(self, tg) -> None:
        self.tg = tg
        self.injected: dict[int, float] = {}          # update_id -> ts
        self.sent: dict[tuple[int, int], dict] = {}   # (chat, message_id) -> record
        self._since = 0.0

    def fetch(self) -> None:
        since = self._since
        now = time.time()
        for rec in self.tg.injected(since=since):
            self.injected[rec["update_id"]] = rec["ts"]
        for rec in self.tg.sent(since=since):
            self.sent[(rec["chat_id"], rec["message_id"])] = rec
        self._since = now - 1.0  # overlapping windows; records are keyed, so read twice is kept once


def drive(stack: Stack, args) -> dict:
    """Queue the chats' messages on schedule for warmup + seconds, then drain. Times are time.time()."""
    records = Records(stack.tg)
    sampler = Sampler(stack, records)
    sampler.sample()
    idle_rss = {name: points[-1][1] for name, points in sampler.rss.items() if points}
    users = [FIRST_USER + i for i in range(args.chats)]
    texts: dict[int, tuple[int, str]] = {}  # update_id -> (chat, text)
    start = time.time() + 0.2
    w0, w1 = start + args.warmup, start + args.warmup + args.seconds
    plan = sorted((start + k * args.period + i * args.period / len(users), user, k)
                  for i, user in enumerate(users)
                  for k in range(int((args.warmup + args.seconds) / args.period) + 1))
    plan = [p for p in plan if p[0] < w1]

    def send(user: int, k: int) -> None:
        update = stack.tg.message(message(user, k), user=user)
        texts[update["update_id"]] = (user, message(user, k))

    sent = send_plan(stack, sampler, plan, send, w0, w1)
    stack.check_alive()
    # drain: every message answered, or the timeout
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        records.fetch()
        answered = Counter(r["text"] for r in records.sent.values())
        missing = [uid for uid, (_, text) in texts.items() if not answered.get("echo: " + text)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    time.sleep(1.0)  # a late duplicate would show
    records.fetch()
    actions = stack.tg.actions()
    return {"records": records, "texts": texts, "w0": w0, "w1": w1, "start": start,
            "rss": sampler.rss, "idle_rss": idle_rss, **sent,
            "actions": [a for a in actions if w0 <= a["ts"] < w1]}


class _NoRecords:
    def fetch(self) -> None:
        pass


def drive_stream(stack: Stack, args) -> int:
    """--stream: the conversations' messages on schedule, then the answers read back and judged."""
    from tests.fake_telegram import DEFAULT_TOKEN

    bot = f"fake{DEFAULT_TOKEN.split(':')[0]}_bot"
    sampler = Sampler(stack, _NoRecords())  # RSS only: the records are read once, at the end
    convs = [(FIRST_USER + i, group_of(FIRST_USER + i) if i % 2 else FIRST_USER + i) for i in range(args.chats)]
    asked: list[gateway_stream.Asked] = []
    start = time.time() + 0.2
    w0, w1 = start + args.warmup, start + args.warmup + args.seconds
    plan = sorted((start + k * args.period + i * args.period / len(convs), i, k) for i in range(len(convs))
                  for k in range(int((args.warmup + args.seconds) / args.period) + 1))
    plan = [p for p in plan if p[0] < w1]
    texts: dict[int, tuple[int, str, str]] = {}  # update_id -> (chat, text, kind)

    def send(i: int, k: int) -> None:
        user, chat = convs[i]
        text = message(user, k)
        if chat < 0:
            update = stack.tg.message(f"@{bot} {text}", user=user, chat_id=chat)
        else:
            update = stack.tg.message(text, user=user)
        texts[update["update_id"]] = (chat, text, "group" if chat < 0 else "private")

    send_plan(stack, sampler, plan, send, w0, w1)
    stack.check_alive()
    answers = {gateway_stream.answer_of(t) for _, t, _ in texts.values()}
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        finals = {r["text"] for r in stack.tg.sent(since=start - 1)}
        if answers <= finals:
            break
        time.sleep(0.5)
    time.sleep(1.5)  # a late draft or a second answer would show
    injected = {r["update_id"]: r["ts"] for r in stack.tg.injected(since=start - 1)}
    for uid, (chat, text, kind) in texts.items():
        asked.append(gateway_stream.Asked(str(chat), text, injected.get(uid, 0.0), kind))
    shown: dict[str, list[gateway_stream.Shown]] = {}
    for d in stack.tg.drafts():
        shown.setdefault(str(d["chat_id"]), []).append(gateway_stream.Shown(d["ts"], "", d["text"], "preview"))
    for r in stack.tg.sent(since=start - 1):
        shown.setdefault(str(r["chat_id"]), []).append(gateway_stream.Shown(
            r["ts"], str(r["message_id"]), r["text"] or "", "edit" if r["kind"] == "edit" else "post"))
    figures, met, ok = gateway_stream.report(gateway_stream.measure(asked, shown), w0, w1, args.drafts == "on",
                                             f"{len(convs)} conversations (private chats and groups), one message"
                                             f" each every {args.period:g} s")
    if args.keep:
        print(f"kept: home {stack.home.root}")
    return targets.last_line({**figures, "chats": args.chats, "seconds": args.seconds}, met, checks_ok=ok)


def db_split(stack: Stack, since: float) -> dict[str, tuple[float, float, float | None]]:
    """text -> (user turn created_at, answer's outbox created_at, sent_at), as the writer stamped them."""
    return gateway_e2e.db_split(stack, INSTANCE, since)


# ---------------------------------------------------------------- report


def analyse(stack: Stack, run: dict) -> dict:
    records, texts, w0, w1 = run["records"], run["texts"], run["w0"], run["w1"]
    by_text: dict[str, list[dict]] = {}
    for rec in sorted(records.sent.values(), key=lambda r: r["ts"]):
        by_text.setdefault(rec["text"], []).append(rec)
    latency, thirds, missing, wrong_chat = [], ([], [], []), [], []
    split = {"queued -> user turn committed (long poll + Inbound)": [],
             "-> answer queued (runner: claim, model, FinishTurn)": [],
             "-> sendMessage at the fake (gateway: claim, pacing, call)": []}
    commits = db_split(stack, run["start"] - 1)
    third = (w1 - w0) / 3
    for uid, (chat, text) in texts.items():
        sent = by_text.get("echo: " + text)
        queued = records.injected.get(uid)
        if not sent or queued is None:
            missing.append(text)
            continue
        if sent[0]["chat_id"] != chat:
            wrong_chat.append(text)
        if not w0 <= queued < w1:
            continue
        ms = (sent[0]["ts"] - queued) * 1000
        latency.append(ms)
        thirds[min(2, int((queued - w0) // third))].append(ms)
        c = commits.get(text)
        if c is not None:
            split["queued -> user turn committed (long poll + Inbound)"].append((c[0] - queued) * 1000)
            split["-> answer queued (runner: claim, model, FinishTurn)"].append((c[1] - c[0]) * 1000)
            split["-> sendMessage at the fake (gateway: claim, pacing, call)"].append((sent[0]["ts"] - c[1]) * 1000)
    duplicates = sum(len(v) - 1 for t, v in by_text.items() if len(v) > 1)
    strays = [t for t in by_text if t.removeprefix("echo: ") not in {x for _, x in texts.values()}]
    in_window = sum(1 for rec in records.sent.values() if w0 <= rec["ts"] < w1)
    p50s = [percentile(sorted(t), 50) for t in thirds]
    return {"latency": latency, "thirds": thirds, "p50s": p50s, "split": split, "missing": missing,
            "wrong_chat": wrong_chat, "duplicates": duplicates, "strays": strays, "in_window": in_window,
            **resources(run), "growth": p50s[2] / p50s[0] if p50s[0] > 0 else float("inf")}


def report(args, stack: Stack, run: dict, res: dict) -> int:
    lat = sorted(res["latency"])
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    rate = res["in_window"] / args.seconds
    offered = args.chats / args.period
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load avg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"processes: fake Bot API, instant fake model, writer, {len(stack.names)} runners, gateway-telegram"
          f" (long polling); this process queues the chats' messages at the fake")
    print(f"load: {args.chats} chats, one message each every {args.period:g}s (open loop, phases spread):"
          f" {offered:.1f} messages/s offered; {args.warmup:g}s warm-up, {args.seconds:g}s measured")
    late = sorted(x * 1000 for x in run["lag"])
    print(f"  this process queued {len(run['texts'])} messages; its lateness against the plan:"
          f" p50 {percentile(late, 50):.1f}  max {late[-1] if late else 0:.1f} ms")
    print("latency = sendMessage arriving at the fake - the update queued there (both the fake's clock):")
    print(f"  all messages queued in the window: {spread(res['latency'])}")
    for i, name in enumerate(("first", "middle", "last")):
        print(f"  {name:6s} third: {spread(res['thirds'][i])}")
    print(f"  growth (p50 last third / first third): {res['growth']:.2f}")
    print("  where the time goes (the writer's commit times):")
    for label, values in res["split"].items():
        print(f"    {label:58s} {spread(values)}")
    print(f"throughput: {rate:.1f} replies/s arrived in the window ({res['in_window']} replies);"
          f" typing actions in the window: {len(run['actions'])}")
    print_resources(res)
    ok = not res["missing"] and not res["duplicates"] and not res["strays"] and not res["wrong_chat"]
    print(f"answers checked: {'OK' if ok else 'MISMATCH'} ({len(run['texts'])} messages; missing"
          f" {len(res['missing'])}, duplicates {res['duplicates']}, strays {len(res['strays'])},"
          f" to the wrong chat {len(res['wrong_chat'])})")
    for text in res["missing"][:5]:
        print(f"  unanswered: {text}")
    procs = [n for n in res["rss"] if n in stack.procs()]
    met = judge(res, p50, p99, procs)
    if args.keep:
        print(f"kept: home {stack.home.root}")
    return targets.last_line({
        **headline(res, lat, rate, offered, procs),
        "chats": args.chats,
        "seconds": args.seconds,
        "messages": len(run["texts"]),
        "duplicates": res["duplicates"],
        "missing": len(res["missing"]),
        "answers_ok": ok,
    }, met, checks_ok=ok)


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument("--chats", type=int, help="private chats, each its own sender (20; --stream: 10, half groups)")
    parser.add_argument("--period", type=float, help="seconds between one chat's messages (1.2; --stream: 6)")
    parser.add_argument("--stream", action="store_true", help="a model streaming 200 tokens over 4 s, drafts shown")
    parser.add_argument("--drafts", choices=("on", "off"), default="on", help="--stream: streaming draft or off")
    parser.add_argument("--runners", type=int, default=2, help="runner processes (the default config's 2)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (printed)")
    args = parser.parse_args(argv)
    args.chats = args.chats if args.chats is not None else (10 if args.stream else 20)
    args.period = args.period if args.period is not None else (6.0 if args.stream else 1.2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.chats < 1 or args.seconds <= 0 or args.warmup < 0 or args.period <= 0 or args.runners < 1:
        print("--chats, --seconds, --period and --runners must be positive, --warmup not negative", file=sys.stderr)
        return 2

    def body(stack: Stack) -> int:
        progress(f"running: {args.warmup:g}s warm-up, {args.seconds:g}s measured, then the drain")
        if args.stream:
            return drive_stream(stack, args)
        run = drive(stack, args)
        progress("reading the results")
        return report(args, stack, run, analyse(stack, run))

    stack = Stack(args.chats, args.runners)
    if args.stream:
        stack.pace = gateway_stream.PACE
        stack.streaming = "draft" if args.drafts == "on" else "off"
    return gateway_e2e.run(args, stack, body)


if __name__ == "__main__":
    gateway_e2e.main_guard(main)
