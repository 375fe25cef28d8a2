"""Burst benchmark: people who type fast, through the Telegram gateway against the fake Bot API.

    python bench/burst.py [--chats 5] [--messages 20] [--gap 0.1] [--slow 2.0] [--runners 2] [--keep]
    python -m bench.burst ...

Two runs, each on a fresh stack of its own (bench/telegram_e2e.py's: the fake Bot API, the fake model, the
writer, ``--runners`` runners and the Telegram gateway in long-polling mode, production defaults, so
[conversation] queue = "collect"): first with the instant fake model, then with one that takes ``--slow`` s
(2) for every answer (each request consumes a scripted {"delay": 2} step of tests/fake_models.py). This
process plays ``--chats`` private chats (5), each sending ``--messages`` (20) messages ``--gap`` s (0.1)
apart, the chats' phases spread over the gap, open loop.

The fake model echoes the last user text it gets, so each answer names the newest message it covers: an
answer "echo: c<chat> m<k>" covers every message of that chat up to k that no earlier answer covered.
Latency = the answer's sendMessage at the fake - the message queued there (the fake's clock). Figures per
run: p50/p95/max of that latency over every message, model calls per message (the fake's requests),
sends per message (sendMessage calls), and the checks: every message covered exactly once, in order, by
an answer in its own chat, no answer twice.

Targets (the issue): instant model p50 < 100 ms and p95 < 500 ms; with the 2 s model at most 0.25 model
calls per message and p95 < 6 s. The last line is one JSON object with ``targets_met``; exit 1 on a miss.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402

from bench import gateway_e2e, targets  # noqa: E402
from bench.gateway_e2e import percentile, progress  # noqa: E402
from bench.telegram_e2e import FIRST_USER, INSTANCE, Stack  # noqa: E402

DRAIN_S = 60.0
ANSWER = re.compile(r"^echo: c(\d+) m(\d+)$")


def text_of(user: int, k: int) -> str:
    return f"c{user} m{k}"


def warm_up(stack: Stack, users: list[int], rounds: int = 3) -> None:
    """A daemon that has been running: each chat says hello and is answered, a few rounds, so every runner
    has done its first turns (imports, the agent's pack, the model's client) before the burst is timed."""
    for n in range(rounds):
        for user in users:
            stack.tg.message(f"hello {n}", user=user)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            said = {(s["chat_id"], s.get("text")) for s in stack.tg.sent()}
            if all((user, f"echo: hello {n}") in said for user in users):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"warm-up round {n} not answered in {DRAIN_S:.0f}s")


def drive(stack: Stack, args, slow: float) -> dict:
    """Queue every chat's messages on schedule, then wait for the answers covering them all."""
    users = [FIRST_USER + i for i in range(args.chats)]
    warm_up(stack, users)
    if slow:
        stack.model.add(*[{"delay": slow} for _ in range(args.chats * args.messages)])
    requests_before = len(stack.model.requests())
    begin = time.time() + 0.3
    plan = sorted((begin + k * args.gap + i * args.gap / len(users), user, k)
                  for i, user in enumerate(users) for k in range(args.messages))
    queued: dict[tuple[int, int], float] = {}  # (chat, k) -> queued at the fake
    ids: dict[int, tuple[int, int]] = {}  # update_id -> (chat, k)
    lateness = []
    for at, user, k in plan:
        pause = at - time.time()
        if pause > 0:
            time.sleep(pause)
        lateness.append(max(0.0, time.time() - at))
        ids[stack.tg.message(text_of(user, k), user=user)["update_id"]] = (user, k)
    for rec in stack.tg.injected(since=begin - 1):
        if rec["update_id"] in ids:
            queued[ids[rec["update_id"]]] = rec["ts"]
    deadline = time.monotonic() + DRAIN_S
    while True:
        sent = [s for s in stack.tg.sent(since=begin)]
        covered = {}
        for s in sent:
            found = ANSWER.match(s.get("text", ""))
            if found:
                covered[int(found[1])] = max(covered.get(int(found[1]), -1), int(found[2]))
        if all(covered.get(u, -1) >= args.messages - 1 for u in users) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    time.sleep(1.0)  # a late duplicate would show
    stack.check_alive()
    split = []  # for each turn's first message: queued -> user turn committed -> answer queued -> sent
    for text, (created, queued_at, sent_at) in gateway_e2e.db_split(stack, INSTANCE, begin - 1).items():
        found = re.fullmatch(r"c(\d+) m(\d+)", text)
        if found and (int(found[1]), int(found[2])) in queued and sent_at:
            at = queued[(int(found[1]), int(found[2]))]
            split.append(((created - at) * 1000, (queued_at - created) * 1000, (sent_at - queued_at) * 1000))
    return {"split": split, "queued": queued, "sent": sorted(stack.tg.sent(since=begin), key=lambda s: s["ts"]),
            "model_calls": len(stack.model.requests()) - requests_before, "lateness": lateness, "users": users}


def analyse(run: dict, messages: int) -> dict:
    """Each message's latency to the first answer covering it, and the checks."""
    latency, problems = [], []
    upto = {u: -1 for u in run["users"]}
    answers = 0
    for s in run["sent"]:
        found = ANSWER.match(s.get("text", ""))
        if not found:
            problems.append(f"stray send: {s.get('text', '')[:60]!r}")
            continue
        user, k = int(found[1]), int(found[2])
        if s["chat_id"] != user:
            problems.append(f"answer for c{user} sent to chat {s['chat_id']}")
        if k <= upto[user]:
            problems.append(f"c{user}: answer for m{k} after m{upto[user]} was covered (twice or out of order)")
            continue
        answers += 1
        for n in range(upto[user] + 1, k + 1):
            if (user, n) in run["queued"]:
                latency.append((s["ts"] - run["queued"][(user, n)]) * 1000)
        upto[user] = k
    missing = sum(max(0, messages - 1 - k) for k in upto.values())
    if missing:
        problems.append(f"{missing} messages never covered by an answer")
    if len(run["queued"]) != len(run["users"]) * messages:
        problems.append(f"{len(run['queued'])} messages queued at the fake of {len(run['users']) * messages}")
    n = len(run["users"]) * messages
    return {"split": run["split"], "latency": sorted(latency), "problems": problems, "answers": answers,
            "calls_per_message": run["model_calls"] / n, "sends_per_message": len(run["sent"]) / n}


def one_run(args, slow: float) -> dict:
    label = f"{slow:g} s model" if slow else "instant model"
    progress(f"{label}: starting the processes")
    stack = Stack(args.chats, args.runners)
    try:
        stack.start()
        progress(f"{label}: {args.chats} chats x {args.messages} messages, {args.gap * 1000:.0f} ms apart")
        res = analyse(drive(stack, args, slow), args.messages)
    finally:
        stack.stop(keep=args.keep)
        if args.keep:
            print(f"kept: home {stack.home.root}")
    lat = res["latency"]
    res["p50"], res["p95"] = percentile(lat, 50), percentile(lat, 95)
    print(f"{label}: message -> the answer covering it: p50 {res['p50']:.1f} ms  p95 {res['p95']:.1f} ms"
          f"  max {lat[-1] if lat else 0:.1f} ms ({len(lat)} messages)")
    print(f"  model calls per message {res['calls_per_message']:.3f}; sends per message"
          f" {res['sends_per_message']:.3f} ({res['answers']} answers)")
    if res["split"]:
        print(f"  where a turn's time goes (its first message; the writer's commit times), p50 of {len(res['split'])}:")
        for i, label in enumerate(("queued -> user turn committed (long poll + Inbound)",
                                   "-> answer queued (runner: claim, fold, model, FinishTurn)",
                                   "-> sent (gateway: outbox claim, pacing, sendMessage)")):
            print(f"    {label:58s} {percentile(sorted(x[i] for x in res['split']), 50):.1f} ms")
    print(f"  checks: {'OK' if not res['problems'] else 'FAILED'}"
          + "".join(f"\n    {p}" for p in res["problems"][:8]))
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chats", type=int, default=5)
    parser.add_argument("--messages", type=int, default=20, help="per chat")
    parser.add_argument("--gap", type=float, default=0.1, help="seconds between one chat's messages")
    parser.add_argument("--slow", type=float, default=2.0, help="the slow model's seconds per answer")
    parser.add_argument("--runners", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the temporary homes (printed)")
    args = parser.parse_args(argv)
    if args.chats < 1 or args.messages < 1 or args.gap <= 0 or args.slow <= 0 or args.runners < 1:
        print("--chats, --messages, --gap, --slow and --runners must be positive", file=sys.stderr)
        return 2
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load avg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("processes: fake Bot API, fake model, writer, "
          f"{args.runners} runners, gateway-telegram (long polling), [conversation] queue = collect")
    fast = one_run(args, 0.0)
    slow = one_run(args, args.slow)
    met = targets.judge(
        targets.below("instant_p50", fast["p50"], 100, " ms", ".1f", label="instant model p50 < 100 ms"),
        targets.below("instant_p95", fast["p95"], 500, " ms", ".1f", label="instant model p95 < 500 ms"),
        targets.below("slow_calls_per_message", slow["calls_per_message"], 0.2500001, "", ".3f",
                      label=f"{args.slow:g} s model calls per message <= 0.25"),
        targets.below("slow_p95", slow["p95"], 6000, " ms", ".1f", label=f"{args.slow:g} s model p95 < 6 s"),
    )
    checks_ok = not fast["problems"] and not slow["problems"]
    figures = {
        "instant": {k: round(fast[k], 3) for k in ("p50", "p95", "calls_per_message", "sends_per_message")},
        "slow": {k: round(slow[k], 3) for k in ("p50", "p95", "calls_per_message", "sends_per_message")},
        "chats": args.chats, "messages_per_chat": args.messages, "gap_s": args.gap, "slow_s": args.slow,
        "checks_ok": checks_ok,
    }
    return targets.last_line(figures, met, checks_ok=checks_ok)


if __name__ == "__main__":
    gateway_e2e.main_guard(main)
