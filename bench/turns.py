"""Runner benchmark: turns per second and the overhead per turn, with an instant fake model.

    python bench/turns.py [--seconds 15] [--warmup 2] [--chats 50] [--rate 200] [--long-turns 10000]
                          [--runners 2] [--seq-turns 100] [--keep]
    python -m bench.turns ...

One temporary home: a writer, two runner processes (``--name runner-0`` / ``runner-1``; config
``[runner] processes = 2`` is what supervisord would start) and the fake model server
(tests/fake_models.py: with an empty script it answers ``echo: <last user text>`` at once), as
processes of their own. This process plays the gateway: one WriterClient sends ``Inbound`` writes for
instance "bench", and a claim loop woken by the writer's outbox events claims the rows
(``ClaimOutbox``), hands each to its chat and marks it sent (``OutboxSent``). The claim loop takes
the events already queued before it claims (one claim answers them all): claiming once per event, or
again after every non-empty claim, doubled the writer's load and the latency under load.

Overhead per turn = (the answer's outbox row created_at - the user turn's created_at), both stamped
by the writer with time.time() and read from the database after the run, minus the model's own time.
The fake's own time is not recorded per request, so it is measured: recorded request bodies of the
phase are replayed to the fake by this process (aiohttp, keep-alive, the system idle) and the median
round trip is subtracted. For an instant fake on loopback it is about a millisecond.

1. capacity: ``--chats`` chats in a closed loop with no think time (each sends its next message the
   moment its answer arrived), ``--warmup`` s unmeasured, then ``--seconds`` s: turns/s = answers
   created in the window / window. At saturation every chat always waits, so the latency here is
   mostly queueing (Little's law: latency = chats / throughput); it is printed, not the target.
2. latency: the same chats at a paced load of ``--rate`` turns/s in all (the throughput target):
   each chat still waits for its answer, then sends after a think time drawn from an exponential
   distribution (people, Poisson-like), for ``--warmup`` + ``--seconds`` s. p50/p99 overhead of the
   turns sent in the window: the JSON's p50/p99.
3. long history: before the processes start (the writer stopped, its lock held by this process, so
   the one-writer rule holds) one session is filled with ``--long-turns`` turns (done user turns and
   their answers). Then ``--seq-turns`` sequential turns alternate between that session and a fresh
   session each (a new chat per turn: empty history). long_history_ratio = median overhead long /
   median overhead empty. ``[conversation] max_conversation_turns`` keeps its default (200): a long
   session sends at most 200 turns of history to the model, by design.

Diagnostics printed with each phase: where the time goes (the runners' turn_claimed log line, the
fake's request time for its last 1,000 requests), the writes each answered turn cost (the writer's
recorded answers by client), runner slots in use, CPU per process and of the whole machine (other
load on it skews every figure).

Every answer is checked: each user turn sent has exactly one outbox row, sent, with the right text,
and every chat got as many answers as it sent messages. Every process is stopped on exit, Ctrl-C or
SIGTERM; should this process die without its cleanup (SIGKILL, a C library's abort), a small reaper
process stops them and removes the home. The last line of output is one JSON object:
{"turns_per_s": ..., "p50_overhead_ms": ..., "p99_overhead_ms": ..., "long_history_ratio": ..., ...}
(turns_per_s from 1; p50/p99 from 2; also the saturated p50 of 1 and the sequential p50/p99 of 3), with
``targets_met``. Targets (issue 4): p50 < 15 ms, p99 < 60 ms, >= 200 turns/s, long history < 1.5x; exit status 1
when one is missed or an answer is wrong (bench/targets.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import faulthandler  # noqa: E402
import fcntl  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from datetime import datetime  # noqa: E402

from bench import targets  # noqa: E402
from bench.writer import cpu_seconds, percentile  # noqa: E402

AGENT, INSTANCE, GATEWAY_WORKER = "default", "bench", "bench-gw"
ANSWER_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 60.0
CLAIM_LIMIT = 64
EVENT_WAIT_S = 0.05  # the claim loop's poll when no outbox event comes (events are hints)
REPLAY_SAMPLES = 40
TARGETS = {"p50": 15.0, "p99": 60.0, "turns_per_s": 200.0, "ratio": 1.5}

# A separate process that outlives this one: it reads "pid N" lines on stdin; at EOF without "done" (this
# process died without its finally: SIGKILL, or a C library's abort) it stops those processes and removes
# the home. It only signals a pid whose command line still names the home (no stray kill of a reused pid).
REAPER = r"""
import os, shutil, signal, sys, time
home, pids, done = sys.argv[1], [], False
for line in sys.stdin:
    if line.startswith("pid "):
        pids.append(int(line.split()[1]))
    elif line.strip() == "done":
        done = True
if done:
    sys.exit(0)
def ours(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return home.encode() in f.read()
    except OSError:
        return False
def wait_gone(group, seconds):
    deadline = time.monotonic() + seconds
    while any(ours(p) for p in group) and time.monotonic() < deadline:
        time.sleep(0.1)
for pid in reversed(pids):  # runners first, while the writer can still take their claims back
    if ours(pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        wait_gone([pid], 5)
for pid in pids:
    if ours(pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
wait_gone(pids, 5)
shutil.rmtree(home, ignore_errors=True)
print(f"turns bench reaper: the benchmark died; stopped {pids} and removed {home}", file=sys.stderr)
"""


def config_text(model_url: str) -> str:
    return (
        "[runner]\nprocesses = 2\n"
        "[providers.default]\n"
        f'kind = "openai"\nbase_url = "{model_url}"\napi_key = "openai"\nmodel = "fake-model"\n'
        "context_window = 128000\n"
    )


def message(tag: str, chat: str, n: int) -> str:
    return f"{tag} {chat} #{n}: what should I plant next to the tomatoes this week?"


# ---------------------------------------------------------------- the stack


class Stack:
    """A home with the fake model, a writer and two runners; ``stop`` ends every process it started."""

    def __init__(self, long_turns: int, runners: int = 2) -> None:
        self.names = [f"runner-{i}" for i in range(runners)]
        self.home = None
        self.fake = None
        self.writer = None
        self.runners: list = []
        self.long_turns = long_turns
        self.long_session = 0
        self.prefill_s = 0.0
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
        from tests.procs import Proc, make_home, start_writer

        self.home = make_home("[runner]\nprocesses = 2\n")
        self.reaper = subprocess.Popen([sys.executable, "-c", REAPER, str(self.home.root)], stdin=subprocess.PIPE,
                                       start_new_session=True)  # not in the terminal's group: Ctrl-C spares it
        self.fake = FakeModelsProcess(self.home.root / "fake", lifetime=3600).start()
        self.guard(self.fake.proc.pid)
        self.home = make_home(config_text(self.fake.openai_url), root=self.home.root)
        set_secret(self.home.paths.secrets_file, "openai", "sk-bench-not-a-real-key-1234")
        create_pack(self.home.paths, AGENT)
        # the writer migrates the new database, then stops: the long session is filled while no writer runs
        self.writer = start_writer(self.home)
        self.guard(self.writer.pid)
        rc = self.writer.stop()
        if rc not in (0, None):
            raise RuntimeError(f"the writer exited with {rc} on stop:\n{self.writer.log_text()[-3000:]}")
        self.writer = None
        if self.long_turns:
            self.prefill()
        self.writer = start_writer(self.home)
        self.guard(self.writer.pid)
        self.runners = [Proc(self.home, "runner", "--name", name) for name in self.names]
        for proc in self.runners:
            self.guard(proc.pid)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not set(self.names) <= {e.get("service") for e in self.runner_events() if e.get("event") == "ready"}:
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the runners were not ready in {READY_TIMEOUT_S:.0f}s:\n"
                                   f"{self.runner_log()[-3000:]}")
            time.sleep(0.05)

    def prefill(self) -> None:
        """``long_turns`` turns in one session, written by this process while it holds the writer's lock
        (data/run/writer.lock, the flock the writer takes at boot): still one writer at a time."""
        from common import db
        from common.stores import db_store, session_store, turn_store

        started = time.monotonic()
        fd = os.open(self.home.paths.run_dir / "writer.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: a writer runs
            conn = db.open_writer(self.home.paths.db_file)
            try:
                base = time.time() - 30 * 86400  # a month of conversation, a few minutes apart
                db_store.begin(conn)
                self.long_session = session_store.open_session(conn, AGENT, INSTANCE, "long", base)
                exchanges = [
                    (message("history", "long", i), "u-long", "echo: " + message("history", "long", i), base + i * 60)
                    for i in range(self.long_turns // 2)
                ]
                turn_store.add_exchanges(conn, self.long_session, exchanges)
                db_store.commit(conn)
            finally:
                conn.close()
        finally:
            os.close(fd)  # releases the flock
        self.prefill_s = time.monotonic() - started

    def check_alive(self) -> None:
        if self.writer is not None and not self.writer.alive():
            raise RuntimeError(f"the writer exited with {self.writer.popen.returncode}:\n"
                               f"{self.writer.log_text()[-3000:]}")
        for proc in self.runners:
            if not proc.alive():
                raise RuntimeError(f"a runner exited with {proc.popen.returncode}:\n{self.runner_log()[-3000:]}")
        if self.fake is not None and self.fake.proc is not None and self.fake.proc.poll() is not None:
            raise RuntimeError(f"the fake model exited with {self.fake.proc.returncode}")

    def runner_log(self) -> str:
        path = self.home.paths.logs_dir / "runner.log"  # both runners append to it (Proc names it by service)
        return path.read_text(errors="replace") if path.exists() else ""

    def runner_events(self) -> list[dict]:
        events = []
        for line in self.runner_log().splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
        return events

    def pids(self) -> dict[str, int]:
        pids = {"writer": self.writer.pid, **{name: p.pid for name, p in zip(self.names, self.runners)}}
        if self.fake is not None and self.fake.proc is not None:
            pids["fake model"] = self.fake.proc.pid
        pids["bench (gateway + chats)"] = os.getpid()
        return pids

    def stop(self, keep: bool = False) -> None:
        from tests.procs import remove_home

        for proc in self.runners:
            proc.stop()
        if self.writer is not None:
            self.writer.stop()
        if self.fake is not None:
            self.fake.stop()
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

    # --- the fake's records ---

    def fake_call(self, method: str, path: str) -> object:
        req = urllib.request.Request(self.fake.url + path, method=method)
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())

    def fake_records(self) -> list[dict]:
        return self.fake_call("GET", "/_requests?api=openai")

    def fake_clear(self) -> None:
        self.fake_call("DELETE", "/_requests")


# ---------------------------------------------------------------- the gateway and the chats


class Gateway:
    """One WriterClient: chats send Inbound writes; a claim loop delivers outbox rows to their chats."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.home = stack.home
        self.inbox: dict[str, asyncio.Queue] = defaultdict(asyncio.Queue)
        self.claims = self.empty_claims = self.delivered = 0
        self._sent_tasks: set[asyncio.Task] = set()
        self.errors: list[str] = []

    async def __aenter__(self) -> Gateway:
        from schema import messages as m

        self.client = self.home.client("bench", window=1024, deadline_s=ANSWER_TIMEOUT_S)
        self.client.start()
        if not await self.client.ping(20.0):
            await self.client.close()
            raise RuntimeError("the writer did not answer a ping in 20s")
        self.sub = self.home.subscriber([m.topic_outbox(INSTANCE)])
        self.sub.start()
        self._stop = asyncio.Event()
        self._loop = asyncio.create_task(self._claim_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        try:
            await asyncio.wait_for(self._loop, 10)
        except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - closing anyway
            self._loop.cancel()
        if self._sent_tasks:
            await asyncio.wait(self._sent_tasks, timeout=10)
        self.sub.close()
        await self.client.close()

    async def _claim_loop(self) -> None:
        from common.errors import BusTimeout, WriteRejected
        from schema import messages as m

        while not self._stop.is_set():
            try:
                claim = await self.client.call(m.ClaimOutbox(worker=GATEWAY_WORKER, instances=[INSTANCE],
                                                             limit=CLAIM_LIMIT))
            except (BusTimeout, WriteRejected) as exc:
                self.errors.append(f"claim: {exc}")
                await asyncio.sleep(0.1)
                continue
            self.claims += 1
            now = time.monotonic()
            for item in claim.items:  # "delivered to the platform": the person sees it now
                self.delivered += 1
                self.inbox[item.chat].put_nowait((item, now))
                task = asyncio.create_task(self._mark_sent(item.id))
                self._sent_tasks.add(task)
                task.add_done_callback(self._sent_tasks.discard)
            if len(claim.items) >= CLAIM_LIMIT:
                continue  # a full claim: more may be waiting
            self.empty_claims += not claim.items
            # wait for a hint (every new outbox row publishes one), then take the hints already queued
            # too: one claim answers them all (a row made after this claim began publishes its own)
            event = await self.sub.next(EVENT_WAIT_S)
            for _ in range(CLAIM_LIMIT):
                if event is None:
                    break
                event = await self.sub.next(0.001)

    async def _mark_sent(self, outbox_id: int) -> None:
        from common.errors import BusTimeout, WriteRejected
        from schema import messages as m

        try:
            await self.client.call(m.OutboxSent(id=outbox_id, worker=GATEWAY_WORKER))
        except (BusTimeout, WriteRejected) as exc:
            self.errors.append(f"sent {outbox_id}: {exc}")

    async def send(self, chat: str, text: str, key: str):
        from schema import messages as m

        return await self.client.call(m.Inbound(agent=AGENT, instance=INSTANCE, chat=chat, sender=f"u-{chat}",
                                                text=text, dedupe_keys=[key]))

    async def answer(self, chat: str, timeout: float = ANSWER_TIMEOUT_S):
        """(outbox item, monotonic time it was claimed), or None after ``timeout``."""
        try:
            return await asyncio.wait_for(self.inbox[chat].get(), timeout)
        except asyncio.TimeoutError:
            return None


class ChatLog:
    def __init__(self, chat: str) -> None:
        self.chat = chat
        self.turn_ids: list[int] = []
        self.duplicates = 0
        self.answers = 0
        self.bodies_ok = 0
        self.timeouts = 0
        self.round_trips: list[tuple[float, float]] = []  # (monotonic send time, send -> answer seen, s)
        self.acks: list[tuple[float, float]] = []  # (monotonic send time, Inbound send -> ack, s)


async def run_chats(gw: Gateway, stack: Stack, tag: str, chats: list[str], warmup: float, seconds: float,
                    rate: float | None, rng: random.Random) -> dict:
    """Each chat sends, waits for its answer, (with ``rate``: thinks), sends again, until the window ends;
    then the answers still coming are awaited. Returns the chat logs and the window (monotonic and wall)."""
    logs = {chat: ChatLog(chat) for chat in chats}
    mono0, wall0 = time.monotonic(), time.time()
    w0 = mono0 + warmup
    w1 = w0 + seconds
    mean_gap = len(chats) / rate if rate else 0.0

    async def chat_loop(log: ChatLog) -> None:
        next_at = mono0 + (rng.uniform(0, mean_gap) if rate else 0.0)
        n = 0
        while True:
            if rate:
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            t0 = time.monotonic()
            if t0 >= w1:
                return
            text = message(tag, log.chat, n)
            accepted = await gw.send(log.chat, text, f"{tag}:{log.chat}:{n}")
            log.acks.append((t0, time.monotonic() - t0))
            log.turn_ids.append(accepted.turn_id)
            log.duplicates += int(accepted.duplicate)
            got = await gw.answer(log.chat)
            if got is None:
                log.timeouts += 1
                return  # a lost answer: counted; the checks below say which turn
            item, seen = got
            log.answers += 1
            log.bodies_ok += int(item.body == "echo: " + text)
            log.round_trips.append((t0, seen - t0))
            n += 1
            if rate:
                next_at = t0 + rng.expovariate(1.0 / mean_gap)

    tasks = [asyncio.create_task(chat_loop(log)) for log in logs.values()]
    pids = stack.pids()
    cpu, machine = {}, {}
    try:
        while time.monotonic() < w0:
            stack.check_alive()
            await asyncio.sleep(min(0.1, max(0.0, w0 - time.monotonic())))
        cpu_before, t_before, machine_before = cpu_seconds(pids), time.monotonic(), machine_cpu()
        while time.monotonic() < w1:
            stack.check_alive()
            await asyncio.sleep(min(0.1, max(0.0, w1 - time.monotonic())))
        cpu_after, t_after, machine_after = cpu_seconds(pids), time.monotonic(), machine_cpu()
        cpu = {name: (cpu_after[name] - cpu_before[name]) / (t_after - t_before)
               for name in pids if name in cpu_before and name in cpu_after}
        machine = {"busy": (machine_after[0] - machine_before[0]) / (t_after - t_before),
                   "steal": (machine_after[1] - machine_before[1]) / (t_after - t_before)}
        done, pending = await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_S + ANSWER_TIMEOUT_S)
        if pending:
            raise RuntimeError(f"{len(pending)} chats did not finish within {DRAIN_TIMEOUT_S + ANSWER_TIMEOUT_S:.0f}s")
        for task in done:
            task.result()  # a chat's own error (a rejected write) ends the run
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {"logs": logs, "mono": (mono0, w0, w1), "wall": (wall0, wall0 + (w0 - mono0), wall0 + (w1 - mono0)),
            "cpu": cpu, "machine": machine}


async def run_sequential(gw: Gateway, stack: Stack, turns: int, warm: int) -> dict:
    """Alternately one turn in the long session and one in a fresh session (a new chat each time)."""
    logs = {"long": ChatLog("long"), "empty": ChatLog("empty")}
    wall0 = time.time()
    kept: dict[str, list[int]] = {"long": [], "empty": []}
    for i in range(warm + turns):
        for side in ("long", "empty"):
            stack.check_alive()
            chat = "long" if side == "long" else f"empty-{i:04d}"
            text = message("seq", chat, i)
            t0 = time.monotonic()
            accepted = await gw.send(chat, text, f"seq:{chat}:{i}")
            got = await gw.answer(chat)
            log = logs[side]
            log.turn_ids.append(accepted.turn_id)
            if got is None:
                log.timeouts += 1
                raise RuntimeError(f"no answer in {ANSWER_TIMEOUT_S:.0f}s for turn {accepted.turn_id} in {chat}")
            item, seen = got
            log.answers += 1
            log.bodies_ok += int(item.body == "echo: " + text)
            log.round_trips.append((t0, seen - t0))
            if i >= warm:
                kept[side].append(accepted.turn_id)
    return {"logs": logs, "kept": kept, "wall0": wall0}


# ---------------------------------------------------------------- reading the results back


def db_times(stack: Stack, since: float) -> tuple[dict[int, tuple[str, str, float]], dict[int, list[tuple]]]:
    """User turns of instance "bench" since ``since`` ({turn id: (chat, state, created_at)}) and their outbox
    rows ({turn id: [(outbox id, chat, state, created_at, sent_at), ...]}); one read transaction."""
    from common import db
    from common.stores import outbox_store, turn_store

    conn = db.open_reader(stack.home.paths.db_file)
    try:
        with db.read_tx(conn):
            turns = {tid: (chat, state, created) for tid, chat, state, created in
                     turn_store.user_turn_times(conn, INSTANCE, since)}
            rows = outbox_store.times(conn, INSTANCE, since)
    finally:
        conn.close()
    outbox: dict[int, list[tuple]] = defaultdict(list)
    for oid, tid, chat, state, created, sent in rows:
        outbox[tid].append((oid, chat, state, created, sent))
    return turns, outbox


def writes_by_client(stack: Stack, since: float, until: float) -> dict[str, Counter]:
    """{client name: Counter(result type)} of the recorded write requests committed in [since, until)
    (every write but Inbound, Heartbeat, Ping and RenewLease is recorded with its answer)."""
    from common import bus, db
    from common.stores import keys_store

    conn = db.open_reader(stack.home.paths.db_file)
    try:
        with db.read_tx(conn):
            rows = keys_store.answers_between(conn, since, until)
    finally:
        conn.close()
    found: dict[str, Counter] = defaultdict(Counter)
    for key, result in rows:
        found[key.split(":", 1)[0]][type(bus.result_decoder.decode(result)).__name__] += 1
    return found


def check_answers(logs: dict[str, ChatLog], turns: dict, outbox: dict, by_chat) -> tuple[bool, list[str]]:
    """Every turn sent has exactly one outbox row, sent; every chat got one answer per message."""
    problems = []
    sent_ids = [tid for log in logs.values() for tid in log.turn_ids]
    for tid in sent_ids:
        rows = outbox.get(tid, [])
        if tid not in turns:
            problems.append(f"turn {tid}: acked but not in the database")
        elif turns[tid][1] != "done":
            problems.append(f"turn {tid}: state {turns[tid][1]}")
        if len(rows) != 1:
            problems.append(f"turn {tid}: {len(rows)} outbox rows")
        elif rows[0][2] != "sent":
            problems.append(f"turn {tid}: outbox row {rows[0][0]} is {rows[0][2]}")
    per_chat_rows = Counter(by_chat(row[1]) for tid in sent_ids for row in outbox.get(tid, []))
    for name, log in logs.items():
        if log.duplicates or log.timeouts or log.answers != len(log.turn_ids) or log.bodies_ok != log.answers:
            problems.append(f"chat {name}: sent {len(log.turn_ids)}, answered {log.answers}, right text"
                            f" {log.bodies_ok}, duplicates {log.duplicates}, timeouts {log.timeouts}")
        if per_chat_rows.get(name, 0) != len(log.turn_ids):
            problems.append(f"chat {name}: {per_chat_rows.get(name, 0)} outbox rows for {len(log.turn_ids)} messages")
    stray = [tid for tid in outbox if tid and tid not in set(sent_ids)]
    if stray:
        problems.append(f"{len(stray)} outbox rows answer turns this phase did not send")
    return not problems, problems


def parse_ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def runner_marks(stack: Stack) -> dict[int, dict]:
    """{turn id: {"runner", "claimed", "done"}} from the runners' turn_claimed / turn_done log lines."""
    marks: dict[int, dict] = {}
    for e in stack.runner_events():
        if e.get("event") in ("turn_claimed", "turn_done") and "turn_id" in e and "ts" in e:
            mark = marks.setdefault(int(e["turn_id"]), {})
            key = "claimed" if e["event"] == "turn_claimed" else "done"
            mark.setdefault(key, parse_ts(e["ts"]))
            mark["runner"] = e.get("service", "?")
    return marks


def slots_in_use(marks: dict[int, dict], since: float, until: float) -> dict[str, tuple[float, int]]:
    """{runner: (time-weighted mean, max) of its turns between turn_claimed and turn_done in [since, until)}."""
    steps: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for mark in marks.values():
        if "claimed" in mark and "done" in mark:
            steps[mark["runner"]] += [(mark["claimed"], 1), (mark["done"], -1)]
    found = {}
    for runner, events in steps.items():
        events.sort()
        level, peak, area, last = 0, 0, 0.0, since
        for t, delta in events:
            if t >= until:
                break
            if t > since:
                area += level * (t - max(last, since))
                last = t
                peak = max(peak, level + delta) if delta > 0 else peak
            level += delta
        area += level * (until - max(last, since))
        found[runner] = (area / (until - since), peak)
    return found


def model_marks(records: list[dict]) -> dict[str, tuple[float, int]]:
    """{last user text: (time the fake got the request, messages in it)}."""
    found = {}
    for r in records:
        messages = (r.get("body") or {}).get("messages") or []
        if messages and isinstance(messages[-1].get("content"), str):
            found[messages[-1]["content"]] = (float(r["ts"]), len(messages))
    return found


async def replay_model(stack: Stack, bodies: list[dict]) -> list[float]:
    """Round trips (ms) of these request bodies sent again to the fake, one at a time, keep-alive: the
    model's own time as a runner's HTTP client sees it, with the rest of the system idle."""
    import aiohttp

    url = stack.fake.openai_url + "/chat/completions"
    payloads = [json.dumps(b).encode() for b in bodies]
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench-not-a-real-key-1234"}
    out = []
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(url, data=payloads[0], headers=headers) as resp:  # connect first, untimed
            await resp.read()
        for payload in payloads:
            t0 = time.perf_counter()
            async with session.post(url, data=payload, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"the fake answered a replayed request with {resp.status}")
            out.append((time.perf_counter() - t0) * 1000)
    return out


def machine_cpu() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat; (0, 0) elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / tick, steal / tick


def spread(values: list[float]) -> str:
    s = sorted(values)
    if not s:
        return "no samples"
    return (f"p50 {percentile(s, 50):.1f}  p90 {percentile(s, 90):.1f}  p99 {percentile(s, 99):.1f}"
            f"  max {s[-1]:.1f} ms  (n={len(s)})")


# ---------------------------------------------------------------- phases


async def load_phase(stack: Stack, gw: Gateway, args, tag: str, rate: float | None, seed: int) -> dict:
    chats = [f"{tag}-{i:02d}" for i in range(args.chats)]
    await asyncio.to_thread(stack.fake_clear)
    run = await run_chats(gw, stack, tag, chats, args.warmup, args.seconds, rate, random.Random(seed))
    await asyncio.sleep(0.3)  # the last OutboxSent acks
    wall0, ww0, ww1 = run["wall"]
    turns, outbox = await asyncio.to_thread(db_times, stack, wall0 - 1)
    turns = {tid: t for tid, t in turns.items() if t[0].startswith(tag + "-")}
    outbox = {tid: rows for tid, rows in outbox.items() if rows[0][1].startswith(tag + "-")}
    ok, problems = check_answers(run["logs"], turns, outbox, lambda chat: chat)
    answered_in_window = sum(1 for rows in outbox.values() for r in rows if ww0 <= r[3] < ww1)
    writes = await asyncio.to_thread(writes_by_client, stack, ww0, ww1)
    records = await asyncio.to_thread(stack.fake_records)
    marks, model = runner_marks(stack), model_marks(records)
    sample = random.Random(seed).sample(records, min(REPLAY_SAMPLES, len(records)))
    model_ms = statistics.median(await replay_model(stack, [r["body"] for r in sample])) if sample else 0.0
    raw, split, model_split = [], defaultdict(list), defaultdict(list)
    texts = {}
    for log in run["logs"].values():
        for n, tid in enumerate(log.turn_ids):
            texts[tid] = message(tag, log.chat, n)
    per_runner = Counter()
    for tid, (chat, state, created) in turns.items():
        rows = outbox.get(tid)
        if not rows or not ww0 <= created < ww1:
            continue
        answered = rows[0][3]
        raw.append((answered - created) * 1000)
        mark = marks.get(tid, {})
        per_runner[mark.get("runner", "?")] += 1
        if "claimed" in mark:
            split["inbound -> claimed (runner log)"].append((mark["claimed"] - created) * 1000)
            split["claimed -> outbox row"].append((answered - mark["claimed"]) * 1000)
            seen = model.get(texts.get(tid, ""))
            if seen:
                model_split["claimed -> model request"].append((seen[0] - mark["claimed"]) * 1000)
                model_split["model request -> outbox row"].append((answered - seen[0]) * 1000)
    lo, hi = run["mono"][1], run["mono"][2]
    e2e = [rt * 1000 for log in run["logs"].values() for t0, rt in log.round_trips if lo <= t0 < hi]
    acks = [rt * 1000 for log in run["logs"].values() for t0, rt in log.acks if lo <= t0 < hi]
    return {"run": run, "ok": ok, "problems": problems, "answered_in_window": answered_in_window,
            "raw": raw, "overhead": [x - model_ms for x in raw], "model_ms": model_ms, "split": split,
            "model_split": model_split, "writes": writes, "slots": slots_in_use(marks, ww0, ww1),
            "per_runner": per_runner, "e2e": e2e, "acks": acks,
            "sent": sum(len(log.turn_ids) for log in run["logs"].values()),
            "records": len(records)}


async def long_phase(stack: Stack, gw: Gateway, args) -> dict:
    await asyncio.to_thread(stack.fake_clear)
    run = await run_sequential(gw, stack, args.seq_turns, args.seq_warmup)
    await asyncio.sleep(0.3)
    turns, outbox = await asyncio.to_thread(db_times, stack, run["wall0"] - 1)

    def ours(chat: str) -> bool:
        return chat == "long" or chat.startswith("empty-")

    turns = {tid: t for tid, t in turns.items() if ours(t[0])}
    outbox = {tid: rows for tid, rows in outbox.items() if ours(rows[0][1])}
    ok, problems = check_answers(run["logs"], turns, outbox, lambda chat: "long" if chat == "long" else "empty")
    # 2 x (warm + turns) requests: all of them kept with the defaults (the fake keeps the last 1,000)
    records = await asyncio.to_thread(stack.fake_records)
    model = model_marks(records)
    by_text = {(r.get("body") or {}).get("messages", [{}])[-1].get("content"): r for r in records}
    result = {"ok": ok, "problems": problems, "run": run}
    for side in ("long", "empty"):
        log = run["logs"][side]
        texts = {tid: message("seq", "long" if side == "long" else f"empty-{i:04d}", i)
                 for i, tid in enumerate(log.turn_ids)}
        kept = run["kept"][side]
        bodies = [by_text[texts[tid]]["body"] for tid in kept if texts[tid] in by_text]
        replay = await replay_model(stack, bodies[:REPLAY_SAMPLES])
        model_ms = statistics.median(replay) if replay else 0.0
        raw = [(outbox[tid][0][3] - turns[tid][2]) * 1000 for tid in kept if tid in turns and outbox.get(tid)]
        pre = [(model[texts[tid]][0] - turns[tid][2]) * 1000 for tid in kept if texts[tid] in model and tid in turns]
        post = [(outbox[tid][0][3] - model[texts[tid]][0]) * 1000 for tid in kept
                if texts[tid] in model and outbox.get(tid)]
        sizes = [model[texts[tid]][1] for tid in kept if texts[tid] in model]
        body_kb = [len(json.dumps(b)) / 1024 for b in bodies]
        result[side] = {"raw": raw, "overhead": [x - model_ms for x in raw], "model_ms": model_ms, "pre": pre,
                        "post": post, "messages": (min(sizes), max(sizes)) if sizes else (0, 0),
                        "body_kb": statistics.median(body_kb) if body_kb else 0.0}
    return result


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="measured window of each load phase")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each window")
    parser.add_argument("--chats", type=int, default=50, help="concurrent chats")
    parser.add_argument("--rate", type=float, default=TARGETS["turns_per_s"],
                        help="turns/s offered in all in the latency phase (default: the throughput target)")
    parser.add_argument("--long-turns", type=int, default=10_000, help="turns in the long session")
    parser.add_argument("--seq-turns", type=int, default=100, help="measured sequential turns per session kind")
    parser.add_argument("--seq-warmup", type=int, default=5, help="unmeasured sequential turns first")
    parser.add_argument("--runners", type=int, default=2, help="runner processes (the issue's setting: 2)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (printed)")
    return parser.parse_args(argv)


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def run_all(stack: Stack, args) -> dict:
    async with Gateway(stack) as gw:
        progress("capacity phase")
        capacity = await load_phase(stack, gw, args, "cap", None, args.seed)
        progress("latency phase")
        latency = await load_phase(stack, gw, args, "lat", args.rate, args.seed + 1)
        progress("long-history phase")
        long = await long_phase(stack, gw, args)
        progress("done")
        gw_stats = {"claims": gw.claims, "empty_claims": gw.empty_claims, "delivered": gw.delivered,
                    "errors": gw.errors[:5], "resent": gw.client.stats.resent}
    return {"capacity": capacity, "latency": latency, "long": long, "gateway": gw_stats}


def report(args, stack: Stack, res: dict) -> int:
    cap, lat, long, gw = res["capacity"], res["latency"], res["long"], res["gateway"]
    turns_per_s = cap["answered_in_window"] / args.seconds
    p50 = percentile(sorted(lat["overhead"]), 50)
    p99 = percentile(sorted(lat["overhead"]), 99)
    med_long = statistics.median(long["long"]["overhead"])
    med_empty = statistics.median(long["empty"]["overhead"])
    ratio = med_long / med_empty if med_empty > 0 else float("inf")
    p99_long = percentile(sorted(long["long"]["overhead"]), 99)
    p99_ratio = p99_long / max(1e-9, percentile(sorted(long["empty"]["overhead"]), 99))

    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load avg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"processes: writer, {len(stack.names)} runners ({', '.join(stack.names)}; turns_per_process"
          f" {stack.home.cfg.runner.turns_per_process}), fake model; this process is the gateway and the chats")
    print("overhead = outbox row created_at - user turn created_at (both stamped by the writer) - the model's"
          " own time (median idle round trip of recorded requests replayed to the fake)")
    for name, phase, what in (("capacity", cap, f"closed loop, no think time, {args.chats} chats"),
                              ("latency", lat, f"{args.chats} chats paced at {args.rate:g} turns/s offered"
                                               " (exponential think time)")):
        window = args.seconds
        print(f"--- {name}: {what}; {args.warmup:g}s warm-up, {window:g}s measured")
        print(f"  answered turns/s: {phase['answered_in_window'] / window:,.1f}"
              f"  ({phase['answered_in_window']:,} answers created in the window;"
              f" {phase['sent']:,} messages sent in all)")
        print(f"  model's own time (fake, idle replay): {phase['model_ms']:.2f} ms")
        print(f"  overhead ms:            {spread(phase['overhead'])}")
        print(f"  inbound -> outbox ms:   {spread(phase['raw'])}")
        print(f"  chat send -> answer seen by the gateway ms: {spread(phase['e2e'])}")
        print(f"  Inbound write -> its ack (bus round trip) ms: {spread(phase['acks'])}")
        for label, values in phase["split"].items():
            print(f"    {label:32s} {spread(values)}")
        print(f"    of the window's turns among the fake's last {phase['records']} requests (the phase's end):")
        for label, values in phase["model_split"].items():
            print(f"    {label:32s} {spread(values)}")
        per_turn = max(1, phase["answered_in_window"])
        print("  writes per answered turn (recorded requests committed in the window, by client and answer): "
              + "; ".join(f"{client}: " + ", ".join(f"{kind} {n / per_turn:.2f}" for kind, n in sorted(c.items()))
                          for client, c in sorted(phase["writes"].items())) + "; plus 1 Inbound (not recorded)")
        print(f"  runner slots in use (turn_claimed..turn_done, of turns_per_process"
              f" {stack.home.cfg.runner.turns_per_process}): "
              + ", ".join(f"{k} mean {mean:.1f} max {peak}" for k, (mean, peak) in sorted(phase["slots"].items())))
        print("  per runner (turns in the window): "
              + ", ".join(f"{k} {v:,}" for k, v in sorted(phase["per_runner"].items())))
        cpu = phase["run"]["cpu"]
        if cpu:
            print("  CPU in the window (share of one core): " + ", ".join(f"{k} {v:.0%}" for k, v in cpu.items())
                  + f"; total {sum(cpu.values()):.2f} of {os.cpu_count()} cores")
        machine = phase["run"]["machine"]
        if machine:
            others = max(0.0, machine["busy"] - sum(cpu.values()))
            print(f"  the whole machine in the window: {machine['busy']:.2f} cores busy, of which"
                  f" {others:.2f} not this benchmark's processes; steal {machine['steal']:.2f}")
        print(f"  answers checked: {'OK' if phase['ok'] else 'MISMATCH'} (each message one outbox row, sent,"
              " the right text, one answer per message per chat)")
        for problem in phase["problems"][:10]:
            print(f"    {problem}")
    lg, em = long["long"], long["empty"]
    print(f"--- long history: one session pre-filled with {args.long_turns:,} turns in {stack.prefill_s:.1f}s"
          f" (writer stopped, its lock held); {args.seq_turns} sequential turns each, alternating with a fresh"
          f" session per turn, after {args.seq_warmup} unmeasured")
    print(f"  max_conversation_turns = {stack.home.cfg.conversation.max_conversation_turns} (default): the long"
          f" session's model requests held {lg['messages'][0]}-{lg['messages'][1]} messages"
          f" ({lg['body_kb']:.0f} KB); the empty ones {em['messages'][0]}-{em['messages'][1]} ({em['body_kb']:.1f} KB)")
    for side, data in (("long", lg), ("empty", em)):
        print(f"  {side:5s} overhead ms: {spread(data['overhead'])}  (model {data['model_ms']:.2f} ms)")
        print(f"        inbound -> model request: {spread(data['pre'])}")
        print(f"        model request -> outbox:  {spread(data['post'])}")
    print(f"  long/empty: median {ratio:.2f}x, p99 {p99_ratio:.2f}x")
    print(f"  answers checked: {'OK' if long['ok'] else 'MISMATCH'}")
    for problem in long["problems"][:10]:
        print(f"    {problem}")
    print(f"gateway: {gw['claims']:,} claims ({gw['empty_claims']:,} empty), {gw['delivered']:,} delivered,"
          f" resent {gw['resent']}, errors {gw['errors'] or 'none'}")
    met = targets.judge(
        targets.at_least("turns_per_s", turns_per_s, TARGETS["turns_per_s"], " turns/s", ".1f",
                         label=f">= {TARGETS['turns_per_s']:g} turns/s"),
        targets.below("p50", p50, TARGETS["p50"], " ms", ".1f"),
        targets.below("p99", p99, TARGETS["p99"], " ms", ".1f"),
        targets.below("ratio", ratio, TARGETS["ratio"], "x", label=f"long history < {TARGETS['ratio']:g}x"),
    )
    if args.keep:
        print(f"kept: home {stack.home.root}")
    ok = cap["ok"] and lat["ok"] and long["ok"]
    return targets.last_line({
        "turns_per_s": round(turns_per_s, 1),
        "p50_overhead_ms": round(p50, 2),
        "p99_overhead_ms": round(p99, 2),
        "long_history_ratio": round(ratio, 3),
        "long_history_p99_ratio": round(p99_ratio, 3),
        "saturated_p50_overhead_ms": round(percentile(sorted(cap["overhead"]), 50), 2),
        "sequential_p50_overhead_ms": round(percentile(sorted(long["empty"]["overhead"]), 50), 2),
        "sequential_p99_overhead_ms": round(percentile(sorted(long["empty"]["overhead"]), 99), 2),
        "latency_phase_turns_per_s": round(lat["answered_in_window"] / args.seconds, 1),
        "model_ms": round(lat["model_ms"], 2),
        "answers_ok": ok,
    }, met, checks_ok=ok)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.chats < 1 or args.seconds <= 0 or args.rate <= 0 or args.seq_turns < 1 or args.runners < 1:
        print("--chats, --seconds, --rate, --seq-turns and --runners must be positive", file=sys.stderr)
        return 2

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # so that every process is stopped and the temp home removed

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored
    faulthandler.enable()  # should a C library abort this process: the Python stacks, then the reaper cleans up
    stack = None
    try:
        stack = Stack(args.long_turns, args.runners)
        stack.start()
        print(f"writer pid {stack.writer.pid}, runner pids {[p.pid for p in stack.runners]}, fake model pid"
              f" {stack.fake.proc.pid}; {args.chats} chats: capacity, then latency at {args.rate:g} turns/s,"
              f" then long history ...", flush=True)
        res = asyncio.run(run_all(stack, args))
        return report(args, stack, res)
    finally:
        if stack is not None:
            stack.stop(keep=args.keep)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; every process stopped, the temporary home removed", file=sys.stderr)
        sys.exit(130)
