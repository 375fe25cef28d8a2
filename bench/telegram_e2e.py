"""Telegram end-to-end benchmark: from an update queued at the Bot API to its reply's sendMessage arriving there.

    python bench/telegram_e2e.py [--seconds 30] [--warmup 5] [--chats 20] [--period 1.2] [--runners 2] [--keep]
    python -m bench.telegram_e2e ...

Processes, each its own as in production: the fake Bot API (tests/fake_telegram.py), the instant fake model
(tests/fake_models.py: ``echo: <last user text>`` at once), the writer, ``--runners`` runners and the Telegram
gateway in long-polling mode, with the production defaults (leases, heartbeats, pacing). This process only
plays the people: it queues their messages at the fake through its control endpoint.

Load: ``--chats`` private chats (20), each sending one message every ``--period`` s (1.2), the chats' phases
spread evenly over the period: about 16.7 messages/s offered, open loop (a message goes at its time whatever
became of the previous one). Why this load: Telegram lets a bot send about one message a second to a chat and
30 a second in all, and the gateway paces itself to that (common/gateway/limits.py), so a chat writing faster
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
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import faulthandler  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

from bench.turns import REAPER, machine_cpu, spread  # noqa: E402
from bench.writer import cpu_seconds, percentile  # noqa: E402

AGENT, INSTANCE = "default", "tg"
FIRST_USER = 2001
READY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 30.0
FETCH_EVERY_S = 5.0   # the fake keeps its last 5,000 records: read them as the run goes
RSS_EVERY_S = 1.0
TARGETS = {"p50": 50.0, "p99": 250.0, "growth": 1.5, "rss_ratio": 1.10, "rss_slack_mb": 2.0}


def config_text(model_url: str, tg_url: str, chats: int, runners: int) -> str:
    users = ", ".join(str(FIRST_USER + i) for i in range(chats))
    return (
        f"[runner]\nprocesses = {runners}\n"
        "[providers.default]\n"
        f'kind = "openai"\nbase_url = "{model_url}"\napi_key = "openai"\nmodel = "fake-model"\n'
        "context_window = 128000\n"
        f'[[gateways.telegram]]\nid = "{INSTANCE}"\nagent = "{AGENT}"\ntoken = "tg-token"\nmode = "polling"\n'
        f'api_base = "{tg_url}"\nallow = [{users}]\n'
    )


def message(chat: int, n: int) -> str:
    return f"chat {chat} #{n}: should the tomatoes go next to the basil this week?"


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (t s, value) points, per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60 * sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


# ---------------------------------------------------------------- the stack


class Stack:
    """A home with the fake Bot API, the fake model, a writer, runners and the gateway; ``stop`` ends them all."""

    def __init__(self, chats: int, runners: int) -> None:
        self.chats = chats
        self.names = [f"runner-{i}" for i in range(runners)]
        self.home = self.tg = self.model = self.writer = self.gateway = None
        self.runners: list = []
        self.reaper: subprocess.Popen | None = None

    def guard(self, pid: int) -> None:
        """Tell the reaper about a process to stop should this one die without cleaning up."""
        if self.reaper is not None and self.reaper.poll() is None:
            self.reaper.stdin.write(f"pid {pid}\n".encode())
            self.reaper.stdin.flush()

    def start(self) -> None:
        from common.personas import create_pack
        from common.secrets import set_secret
        from tests.fake_models import FakeModelsProcess
        from tests.fake_telegram import DEFAULT_TOKEN, FakeTelegramProcess
        from tests.procs import Proc, make_home, start_writer

        self.home = make_home("")
        reaper = REAPER.replace("turns bench reaper", "telegram bench reaper")
        self.reaper = subprocess.Popen([sys.executable, "-c", reaper, str(self.home.root)], stdin=subprocess.PIPE,
                                       start_new_session=True)  # not in the terminal's group: Ctrl-C spares it
        self.model = FakeModelsProcess(self.home.root / "fake-model", lifetime=3600).start()
        self.guard(self.model.proc.pid)
        self.tg = FakeTelegramProcess(self.home.root / "fake-tg", lifetime=3600).start()
        self.guard(self.tg.proc.pid)
        text = config_text(self.model.openai_url, self.tg.url, self.chats, len(self.names))
        self.home = make_home(text, root=self.home.root)
        set_secret(self.home.paths.secrets_file, "openai", "sk-bench-not-a-real-key-1234")
        set_secret(self.home.paths.secrets_file, "tg-token", DEFAULT_TOKEN)
        create_pack(self.home.paths, AGENT)
        self.writer = start_writer(self.home)
        self.guard(self.writer.pid)
        self.runners = [Proc(self.home, "runner", "--name", name) for name in self.names]
        for proc in self.runners:
            self.guard(proc.pid)
        self.gateway = Proc(self.home, "gateway_telegram")
        self.guard(self.gateway.pid)
        deadline = time.monotonic() + READY_TIMEOUT_S
        want = {*self.names, "gateway-telegram"}
        while not want <= self.ready():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready in {READY_TIMEOUT_S:.0f}s: {sorted(want - self.ready())}\n"
                                   f"{self.gateway.log_text()[-2000:]}")
            time.sleep(0.05)

    def ready(self) -> set[str]:
        found = set()
        for name in ("runner.log", "gateway_telegram.log"):  # both runners append to runner.log
            path = self.home.paths.logs_dir / name
            for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
                if '"event":"ready"' in line:
                    try:
                        found.add(json.loads(line)["service"])
                    except (ValueError, KeyError):
                        pass
        return found

    def check_alive(self) -> None:
        for name, proc in self.procs().items():
            if not proc.alive():
                raise RuntimeError(f"{name} exited with {proc.popen.returncode}:\n{proc.log_text()[-3000:]}")
        for fake in (self.tg, self.model):
            if fake.proc.poll() is not None:
                raise RuntimeError(f"{fake.name} exited with {fake.proc.returncode}")

    def procs(self) -> dict:
        return {"writer": self.writer, **dict(zip(self.names, self.runners)), "gateway": self.gateway}

    def pids(self) -> dict[str, int]:
        return {**{name: p.pid for name, p in self.procs().items()}, "fake bot api": self.tg.proc.pid,
                "fake model": self.model.proc.pid, "bench (the people)": os.getpid()}

    def stop(self, keep: bool = False) -> None:
        from tests.procs import remove_home

        for proc in [self.gateway, *self.runners, self.writer]:  # the writer last: the others hand back leases
            if proc is not None:
                proc.stop()
        for fake in (self.tg, self.model):
            if fake is not None:
                fake.stop()
        if self.home is not None and not keep:
            remove_home(self.home)
        if self.reaper is not None:
            try:
                self.reaper.stdin.write(b"done\n")
                self.reaper.stdin.close()
            except OSError:
                pass
            try:
                self.reaper.wait(5)
            except subprocess.TimeoutExpired:
                self.reaper.kill()
                self.reaper.wait(5)


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


class Sampler(threading.Thread):
    """RSS of every process each second, the fake's records every few seconds."""

    def __init__(self, stack: Stack, records: Records) -> None:
        super().__init__(daemon=True)
        self.stack = stack
        self.records = records
        self.rss: dict[str, list[tuple[float, float]]] = {name: [] for name in stack.pids()}
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def sample(self) -> None:
        now = time.time()
        for name, pid in self.stack.pids().items():
            value = rss_mb(pid)
            if value is not None:
                self.rss[name].append((now, value))

    def run(self) -> None:
        next_fetch = time.monotonic() + FETCH_EVERY_S
        try:
            while not self.stop.wait(RSS_EVERY_S):
                self.sample()
                if time.monotonic() >= next_fetch:
                    self.records.fetch()
                    next_fetch += FETCH_EVERY_S
        except BaseException as exc:  # reported by the run
            self.error = exc


def drive(stack: Stack, args) -> dict:
    """Queue the chats' messages on schedule for warmup + seconds, then drain. Times are time.time()."""
    records = Records(stack.tg)
    sampler = Sampler(stack, records)
    sampler.sample()
    idle_rss = {name: points[-1][1] for name, points in sampler.rss.items() if points}
    users = [FIRST_USER + i for i in range(args.chats)]
    texts: dict[int, tuple[int, str]] = {}  # update_id -> (chat, text)
    lag: list[float] = []
    start = time.time() + 0.2
    w0, w1 = start + args.warmup, start + args.warmup + args.seconds
    plan = sorted((start + k * args.period + i * args.period / len(users), user, k)
                  for i, user in enumerate(users)
                  for k in range(int((args.warmup + args.seconds) / args.period) + 1))
    plan = [p for p in plan if p[0] < w1]
    cpu0 = cpu1 = mach0 = mach1 = None
    sampler.start()
    try:
        for at, user, k in plan:
            if cpu0 is None and at >= w0:
                time.sleep(max(0.0, w0 - time.time()))
                cpu0, mach0 = cpu_seconds(stack.pids()), machine_cpu()
                sampler.sample()
            time.sleep(max(0.0, at - time.time()))
            lag.append(time.time() - at)
            update = stack.tg.message(message(user, k), user=user)
            texts[update["update_id"]] = (user, message(user, k))
        time.sleep(max(0.0, w1 - time.time()))
        cpu1, mach1 = cpu_seconds(stack.pids()), machine_cpu()
        sampler.sample()
        sampler.stop.set()
        sampler.join(10)  # the drain below reads the records in this thread alone
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
    finally:
        sampler.stop.set()
        sampler.join(10)
    if sampler.error is not None:
        raise sampler.error
    actions = stack.tg.actions()
    return {"records": records, "texts": texts, "lag": lag, "w0": w0, "w1": w1, "start": start,
            "rss": sampler.rss, "idle_rss": idle_rss, "cpu": (cpu0, cpu1), "machine": (mach0, mach1),
            "actions": [a for a in actions if w0 <= a["ts"] < w1]}


def db_split(stack: Stack, since: float) -> dict[str, tuple[float, float, float | None]]:
    """text -> (user turn created_at, answer's outbox created_at, sent_at), as the writer stamped them."""
    from common import db
    from common.db import read_tx
    from common.stores import outbox_store, turn_store

    conn = db.open_reader(stack.home.paths.db_file)
    found = {}
    try:
        with read_tx(conn) as tx:
            for _id, turn_id, _chat, _state, created, sent_at in outbox_store.times(tx, INSTANCE, since):
                turn = turn_store.get(tx, turn_id) if turn_id else None
                if turn is not None:
                    found[turn.content] = (turn.created_at, created, sent_at)
    finally:
        conn.close()
    return found


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
    rss = {}
    for name, points in run["rss"].items():
        inside = [(t, v) for t, v in points if w0 - 0.5 <= t <= w1 + 0.5]
        if inside:
            rss[name] = {"idle": run["idle_rss"].get(name), "start": inside[0][1], "end": inside[-1][1],
                         "slope": slope_per_min(inside)}
    (cpu0, cpu1), (m0, m1) = run["cpu"], run["machine"]
    window = w1 - w0
    cpu = {k: (cpu1[k] - cpu0[k]) / window for k in cpu1 if k in cpu0} if cpu0 and cpu1 else {}
    machine = {"busy": (m1[0] - m0[0]) / window, "steal": (m1[1] - m0[1]) / window} if m0 and m1 else {}
    p50s = [percentile(sorted(t), 50) for t in thirds]
    return {"latency": latency, "thirds": thirds, "p50s": p50s, "split": split, "missing": missing,
            "wrong_chat": wrong_chat, "duplicates": duplicates, "strays": strays, "in_window": in_window,
            "rss": rss, "cpu": cpu, "machine": machine,
            "growth": p50s[2] / p50s[0] if p50s[0] > 0 else float("inf")}


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
    print("RSS MB (idle after start -> window start -> window end; slope over the window):")
    for name, r in res["rss"].items():
        idle = f"{r['idle']:.1f}" if r["idle"] is not None else "?"
        print(f"  {name:20s} {idle:>7s} -> {r['start']:7.1f} -> {r['end']:7.1f}   {r['slope']:+.2f} MB/min")
    if res["cpu"]:
        print("CPU in the window (share of one core): "
              + ", ".join(f"{k} {v:.0%}" for k, v in res["cpu"].items())
              + f"; total {sum(res['cpu'].values()):.2f} of {os.cpu_count()} cores")
    if res["machine"]:
        others = max(0.0, res["machine"]["busy"] - sum(res["cpu"].values()))
        print(f"the whole machine in the window: {res['machine']['busy']:.2f} cores busy, of which {others:.2f}"
              f" not this benchmark's processes; steal {res['machine']['steal']:.2f}")
    ok = not res["missing"] and not res["duplicates"] and not res["strays"] and not res["wrong_chat"]
    print(f"answers checked: {'OK' if ok else 'MISMATCH'} ({len(run['texts'])} messages; missing"
          f" {len(res['missing'])}, duplicates {res['duplicates']}, strays {len(res['strays'])},"
          f" to the wrong chat {len(res['wrong_chat'])})")
    for text in res["missing"][:5]:
        print(f"  unanswered: {text}")
    procs = [n for n in res["rss"] if n in stack.procs()]
    rss_ok = all(res["rss"][n]["end"] <= res["rss"][n]["start"] * TARGETS["rss_ratio"] + TARGETS["rss_slack_mb"]
                 for n in procs)
    met = {"p50": p50 < TARGETS["p50"], "p99": p99 < TARGETS["p99"], "growth": res["growth"] < TARGETS["growth"],
           "rss": rss_ok}
    print(f"targets: p50 < {TARGETS['p50']:g} ms {'met' if met['p50'] else 'NOT met'} ({p50:.1f});"
          f" p99 < {TARGETS['p99']:g} ms {'met' if met['p99'] else 'NOT met'} ({p99:.1f});"
          f" latency growth < {TARGETS['growth']:g} {'met' if met['growth'] else 'NOT met'} ({res['growth']:.2f});"
          f" RSS within {TARGETS['rss_ratio'] - 1:.0%} + {TARGETS['rss_slack_mb']:g} MB"
          f" {'met' if met['rss'] else 'NOT met'}")
    if args.keep:
        print(f"kept: home {stack.home.root}")
    print(json.dumps({
        "p50_ms": round(p50, 1),
        "p99_ms": round(p99, 1),
        "max_ms": round(lat[-1], 1) if lat else 0.0,
        "messages_per_s": round(rate, 1),
        "offered_per_s": round(offered, 1),
        "latency_growth": round(res["growth"], 2),
        "p50_thirds_ms": [round(x, 1) for x in res["p50s"]],
        "rss_mb": {n: [round(res["rss"][n]["start"], 1), round(res["rss"][n]["end"], 1)] for n in procs},
        "rss_slope_mb_per_min": {n: round(res["rss"][n]["slope"], 2) for n in procs},
        "chats": args.chats,
        "seconds": args.seconds,
        "messages": len(run["texts"]),
        "duplicates": res["duplicates"],
        "missing": len(res["missing"]),
        "answers_ok": ok,
        "targets_met": all(met.values()),
    }), flush=True)
    return 0 if ok else 1


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=5.0, help="unmeasured seconds first")
    parser.add_argument("--chats", type=int, default=20, help="private chats, each its own sender")
    parser.add_argument("--period", type=float, default=1.2, help="seconds between one chat's messages")
    parser.add_argument("--runners", type=int, default=2, help="runner processes (the default config's 2)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (printed)")
    return parser.parse_args(argv)


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.chats < 1 or args.seconds <= 0 or args.warmup < 0 or args.period <= 0 or args.runners < 1:
        print("--chats, --seconds, --period and --runners must be positive, --warmup not negative", file=sys.stderr)
        return 2

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # so that every process is stopped and the temp home removed

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.enable()
    stack = None
    try:
        stack = Stack(args.chats, args.runners)
        progress("starting the processes")
        stack.start()
        print(f"pids: {stack.pids()}", flush=True)
        progress(f"running: {args.warmup:g}s warm-up, {args.seconds:g}s measured, then the drain")
        run = drive(stack, args)
        progress("reading the results")
        return report(args, stack, run, analyse(stack, run))
    finally:
        if stack is not None:
            stack.stop(keep=args.keep)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; every process stopped, the temporary home removed", file=sys.stderr)
        sys.exit(130)
