"""What the end-to-end gateway benchmarks share (bench/telegram_e2e.py, bench/slack_e2e.py,
bench/whatsapp_e2e.py): the stack of real processes around a fake platform (with a reaper should the benchmark
die), an open-loop sender, RSS and CPU sampling, the resource figures and their report, the split of latency
by the writer's commit times, and a main() that stops every process on exit, Ctrl-C or SIGTERM.

A platform's benchmark subclasses `BenchStack` (its fake, config and secrets) and writes its own driving,
matching of replies to messages, and report around these pieces.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Hashable

from bench import targets
from bench.turns import REAPER, machine_cpu, spread
from bench.writer import cpu_seconds, percentile

READY_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 30.0
FETCH_EVERY_S = 5.0   # the fakes keep their last 5,000 records of a kind: read them as the run goes
RSS_EVERY_S = 1.0
TARGETS = {"p50": 50.0, "p99": 250.0, "growth": 1.5, "rss_ratio": 1.10, "rss_slack_mb": 2.0}

__all__ = [
    "BenchStack", "DRAIN_TIMEOUT_S", "FETCH_EVERY_S", "READY_TIMEOUT_S", "RSS_EVERY_S", "Sampler", "TARGETS",
    "db_split", "machine_cpu", "main_guard", "percentile", "print_resources", "progress", "resources", "rss_mb",
    "rss_ok", "run", "send_plan", "slope_per_min", "spread",
]


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


def progress(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the stack


class BenchStack:
    """A home with a fake platform, the fake model, a writer, runners and the gateway; ``stop`` ends them all.

    Subclasses set ``service`` (the gateway's module under services/, e.g. "gateway.telegram"), ``fake_label``
    (its name in the figures) and ``reaper_name``, and implement ``start_fake``, ``config_text`` and
    ``secrets``; ``connected`` says when the gateway is talking to the platform (default: once ready)."""

    service = ""
    fake_label = "fake platform"
    reaper_name = "gateway bench reaper"
    pace: dict | None = None  # the fake model's pace ({"tokens", "seconds"}: bench/gateway_stream.py); None: instant

    def __init__(self, chats: int, runners: int) -> None:
        self.chats = chats
        self.names = [f"runner-{i}" for i in range(runners)]
        self.home = self.fake = self.model = self.writer = self.gateway = None
        self.runners: list = []
        self.reaper: subprocess.Popen | None = None

    # ---- what a platform says

    def start_fake(self, root: Path):
        """Start the fake platform (a tests.fake_server.FakeServerProcess) under ``root``; return it."""
        raise NotImplementedError

    def config_text(self, model_url: str) -> str:
        """The whole config.toml: [runner], [providers.default] at ``model_url``, the gateway's table."""
        raise NotImplementedError

    def secrets(self) -> dict[str, str]:
        """The secrets the config names (the model's key is set already)."""
        raise NotImplementedError

    def connected(self) -> bool:
        return True

    # ---- life

    @property
    def gateway_name(self) -> str:
        return self.service.replace(".", "-")  # the service's name in its log lines

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

        self.home = make_home("")
        reaper = REAPER.replace("turns bench reaper", self.reaper_name)
        self.reaper = subprocess.Popen([sys.executable, "-c", reaper, str(self.home.root)], stdin=subprocess.PIPE,
                                       start_new_session=True)  # not in the terminal's group: Ctrl-C spares it
        self.model = FakeModelsProcess(self.home.root / "fake-model", lifetime=3600, pace=self.pace).start()
        self.guard(self.model.proc.pid)
        self.fake = self.start_fake(self.home.root)
        self.guard(self.fake.proc.pid)
        self.home = make_home(self.config_text(self.model.openai_url), root=self.home.root)
        set_secret(self.home.paths.secrets_file, "openai", "sk-bench-not-a-real-key-1234")
        for name, value in self.secrets().items():
            set_secret(self.home.paths.secrets_file, name, value)
        create_pack(self.home.paths, "default")
        self.writer = start_writer(self.home)
        self.guard(self.writer.pid)
        self.runners = [Proc(self.home, "runner", "--name", name) for name in self.names]
        for proc in self.runners:
            self.guard(proc.pid)
        self.gateway = Proc(self.home, self.service)
        self.guard(self.gateway.pid)
        deadline = time.monotonic() + READY_TIMEOUT_S
        want = {*self.names, self.gateway_name}
        while not (want <= self.ready() and self.connected()):
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready in {READY_TIMEOUT_S:.0f}s: {sorted(want - self.ready())}"
                                   f" (connected: {self.connected()})\n{self.gateway.log_text()[-2000:]}")
            time.sleep(0.05)

    def ready(self) -> set[str]:
        found = set()
        for name in ("runner.log", f"{self.service}.log"):  # the runners all append to runner.log
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
        for fake in (self.fake, self.model):
            if fake.proc.poll() is not None:
                raise RuntimeError(f"{fake.name} exited with {fake.proc.returncode}")

    def procs(self) -> dict:
        """Starling's processes by name."""
        return {"writer": self.writer, **dict(zip(self.names, self.runners)), "gateway": self.gateway}

    def pids(self) -> dict[str, int]:
        return {**{name: p.pid for name, p in self.procs().items()}, self.fake_label: self.fake.proc.pid,
                "fake model": self.model.proc.pid, "bench (the people)": os.getpid()}

    def stop(self, keep: bool = False) -> None:
        from tests.procs import remove_home

        for proc in [self.gateway, *self.runners, self.writer]:  # the writer last: the others hand back leases
            if proc is not None:
                proc.stop()
        for fake in (self.fake, self.model):
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


# ---------------------------------------------------------------- sampling and sending


class Sampler(threading.Thread):
    """RSS of every process each second, and ``records.fetch()`` (the fake's records) every few seconds."""

    def __init__(self, stack: BenchStack, records) -> None:
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


def send_plan(stack: BenchStack, sampler: Sampler, plan: list[tuple[float, Hashable, int]],
              send: Callable[[Hashable, int], object], w0: float, w1: float) -> dict:
    """Send ``plan`` ([(time.time() to send at, conversation, k)], in time order) open loop: each message at
    its time whatever became of the others. CPU is read at the window's start ``w0`` and end ``w1``; the
    sampler is started, and stopped at ``w1``. Returns {"lag": [s late against the plan], "cpu": (at w0,
    at w1), "machine": (at w0, at w1)}."""
    cpu0 = cpu1 = mach0 = mach1 = None
    lag: list[float] = []
    sampler.start()
    try:
        for at, conversation, k in plan:
            if cpu0 is None and at >= w0:
                time.sleep(max(0.0, w0 - time.time()))
                cpu0, mach0 = cpu_seconds(stack.pids()), machine_cpu()
                sampler.sample()
            time.sleep(max(0.0, at - time.time()))
            lag.append(time.time() - at)
            send(conversation, k)
        time.sleep(max(0.0, w1 - time.time()))
        cpu1, mach1 = cpu_seconds(stack.pids()), machine_cpu()
        sampler.sample()
    finally:
        sampler.stop.set()
        sampler.join(10)  # what follows reads the records in this thread alone
    if sampler.error is not None:
        raise sampler.error
    return {"lag": lag, "cpu": (cpu0, cpu1), "machine": (mach0, mach1)}


# ---------------------------------------------------------------- figures


def db_split(stack: BenchStack, instance: str, since: float) -> dict[str, tuple[float, float, float | None]]:
    """User turn text -> (its created_at, its answer's outbox created_at, sent_at), as the writer stamped them."""
    from common import db
    from common.db import read_tx
    from common.stores import outbox_store, turn_store

    conn = db.open_reader(stack.home.paths.db_file)
    found = {}
    try:
        with read_tx(conn) as tx:
            for _id, turn_id, _chat, _state, created, sent_at in outbox_store.times(tx, instance, since):
                turn = turn_store.get(tx, turn_id) if turn_id else None
                if turn is not None:
                    found[turn.content] = (turn.created_at, created, sent_at)
    finally:
        conn.close()
    return found


def resources(run: dict) -> dict:
    """RSS per process over the window (idle after start, window start and end, slope), CPU per process and
    of the machine in the window; from run's "rss", "idle_rss", "cpu", "machine", "w0" and "w1"."""
    w0, w1 = run["w0"], run["w1"]
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
    return {"rss": rss, "cpu": cpu, "machine": machine}


def print_resources(res: dict) -> None:
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


def rss_ok(res: dict, procs: list[str]) -> bool:
    """Each of ``procs`` ended the window within TARGETS' ratio + slack of its RSS at the window's start."""
    return all(res["rss"][n]["end"] <= res["rss"][n]["start"] * TARGETS["rss_ratio"] + TARGETS["rss_slack_mb"]
               for n in procs)


# ---------------------------------------------------------------- main


def judge(res: dict, p50: float, p99: float, procs: list[str]) -> dict[str, bool]:
    """The issue's targets against this run's figures; prints the line saying which were met."""
    rss = rss_ok(res, procs)
    return targets.judge(
        targets.below("p50", p50, TARGETS["p50"], " ms", ".1f"),
        targets.below("p99", p99, TARGETS["p99"], " ms", ".1f"),
        targets.below("growth", res["growth"], TARGETS["growth"], label=f"latency growth < {TARGETS['growth']:g}"),
        targets.Target("rss", f"RSS within {TARGETS['rss_ratio'] - 1:.0%} + {TARGETS['rss_slack_mb']:g} MB", rss,
                       "each process" if rss else "a process grew"),
    )


def headline(res: dict, lat: list[float], rate: float, offered: float, procs: list[str], **middle) -> dict:
    """The JSON fields every gateway benchmark prints first (``middle``: its own, before the RSS figures)."""
    return {
        "p50_ms": round(percentile(lat, 50), 1),
        "p99_ms": round(percentile(lat, 99), 1),
        "max_ms": round(lat[-1], 1) if lat else 0.0,
        "messages_per_s": round(rate, 1),
        "offered_per_s": round(offered, 1),
        "latency_growth": round(res["growth"], 2),
        "p50_thirds_ms": [round(x, 1) for x in res["p50s"]],
        **middle,
        "rss_mb": {n: [round(res["rss"][n]["start"], 1), round(res["rss"][n]["end"], 1)] for n in procs},
        "rss_slope_mb_per_min": {n: round(res["rss"][n]["slope"], 2) for n in procs},
    }


def run(args, stack: BenchStack, body: Callable[[BenchStack], int]) -> int:
    """Start ``stack``, run ``body(stack)`` and stop every process whatever happens (SIGTERM too)."""

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # so that every process is stopped and the temp home removed

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faulthandler.enable()
    try:
        progress("starting the processes")
        stack.start()
        print(f"pids: {stack.pids()}", flush=True)
        return body(stack)
    finally:
        stack.stop(keep=args.keep)


def main_guard(main: Callable[[], int]) -> None:
    """``if __name__ == "__main__"``: exit with main()'s status; 130 after Ctrl-C, every process stopped."""
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; every process stopped, the temporary home removed", file=sys.stderr)
        sys.exit(130)
