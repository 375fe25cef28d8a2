"""Sweep benchmark: a retention pass that deletes 30 of 60 days of a 1,000,000-turn database while chats go on.

    python bench/sweep.py [--turns 1000000] [--days 60] [--keep-days 30] [--chats 200] [--rate 100]
                          [--baseline 3] [--keep]
    python -m bench.sweep ...

1. Build: a fresh temporary home; this process, before any service starts, writes ``--turns`` turns
   with the store functions (retention_store.seed_*): ``--chats`` chats, one conversation per chat per
   day over ``--days`` days up to now (a day's turns between one hour after its start and one hour
   before its end, so the cutoff falls between days), each exchange a user turn, its answer and the
   answer's delivered outbox row, the recall index kept by its triggers as in a live install.
2. A real writer process running the writer's own code, with a shim from this file that times every
   write transaction (BEGIN IMMEDIATE to the end of COMMIT, fsync included) and every WAL checkpoint
   and writes them out when the writer stops. A producer in this process sends ``Inbound`` turn
   writes through the bus at ``--rate`` per second (open loop, to chats the sweep does not touch) and
   times each ack: ``--baseline`` seconds before the sweep, then through it.
3. A real sweeper process with ``[retention] session_days = --keep-days``: its first pass deletes
   every conversation last active before the window, in bounded steps. The producer goes on until the
   pass has logged its ``retention_swept`` line.

Figures: the pass's seconds and rows (from that line), the longest write transaction while the pass
ran (target < 100 ms, so chats keep flowing; wall time, and the writer's CPU time in the most costly
one, which tells work from waiting on a busy machine) and the longest purge step inside one, the longest
checkpoint, turn-write ack latency (p50, p99, max) during the pass and in the baseline, and a check
that exactly the turns of the days past the window are gone. The last line is one JSON object:
{"turns": ..., "sweep_s": ..., "turns_deleted": ..., "longest_write_tx_ms": ..., "turn_write_p99_ms": ..., ...,
"targets_met": ...}; exit status 1 when the target is missed, a write failed or the wrong turns went.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from datetime import datetime  # noqa: E402

from bench import targets  # noqa: E402

DAY = 86400.0
HOUR = 3600.0
BUILD_BATCH_PAIRS = 20_000  # exchanges per build transaction (then a TRUNCATE checkpoint)
LIVE_CHATS = 20
SWEEP_TIMEOUT_S = 3600.0
TARGET_LONGEST_TX_MS = 100.0  # issue 6: so chats keep flowing


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


# ---------------------------------------------------------------- the writer, timed (its own process)


def writer_with_timing(home: str, stats: str) -> int:
    """The writer's main(), with db_store.begin/commit and Maintenance.checkpoint timed."""
    from common.stores import db_store
    from services.writer import main as writer
    from services.writer.maintenance import Maintenance

    # (wall time at BEGIN, ms to the end of COMMIT, ms of the writer's CPU in between)
    transactions: list[tuple[float, float, float]] = []
    checkpoints: list[tuple[float, float, str]] = []
    began: list[float] = [0.0, 0.0, 0.0]
    begin, commit, checkpoint = db_store.begin, db_store.commit, Maintenance.checkpoint

    def timed_begin(conn) -> None:
        began[:] = time.time(), time.perf_counter(), time.thread_time()
        begin(conn)

    def timed_commit(conn) -> None:
        commit(conn)
        transactions.append((began[0], (time.perf_counter() - began[1]) * 1000, (time.thread_time() - began[2]) * 1000))

    def timed_checkpoint(self, mode: str):
        wall, t0 = time.time(), time.perf_counter()
        try:
            return checkpoint(self, mode)
        finally:
            checkpoints.append((wall, (time.perf_counter() - t0) * 1000, mode.upper()))

    db_store.begin, db_store.commit, Maintenance.checkpoint = timed_begin, timed_commit, timed_checkpoint
    code = writer.main(["--home", home])
    tmp = stats + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"transactions": transactions, "checkpoints": checkpoints}, f)
    os.replace(tmp, stats)
    return code


# ---------------------------------------------------------------- build


def plan(turns: int, days: int, chats: int, now: float) -> list[tuple[int, int, int, float, float]]:
    """(day, chat, exchanges, first, last) per conversation; day k ends k days before ``now``."""
    pairs = turns // 2
    sessions = days * chats
    out = []
    for day in range(days - 1, -1, -1):  # oldest first
        start = now - (day + 1) * DAY + HOUR
        end = now - day * DAY - HOUR
        for chat in range(chats):
            n = pairs // sessions + (1 if chat * days + day < pairs % sessions else 0)  # the rest spread over days
            if n:
                out.append((day, chat, n, start, end))
    return out


def build(home, args, now: float) -> dict[int, int]:
    """Write the history; returns turns per day (day k = k days ago)."""
    from common import db
    from common.stores import db_store, retention_store, schema_store

    conn = db.open_writer(home.paths.db_file)
    per_day: dict[int, int] = {}
    try:
        schema_store.migrate(conn, home.paths.db_file)
        conversations = plan(args.turns, args.days, args.chats, now)
        last_day = min((c[0] for c in conversations), default=0)
        pending = 0
        db_store.begin(conn)
        for day, chat, n, start, end in conversations:
            step = (end - start) / max(1, n - 1) if n > 1 else 0.0
            open_ = day == last_day
            sid = retention_store.seed_session(conn, "default", "bench", f"c{chat}", start, start + step * (n - 1),
                                               None if open_ else start + step * (n - 1), "" if open_ else "daily")
            exchanges = [(f"day {day} chat {chat} message {i}: when does the ferry to the island leave",
                          f"the ferry leaves at {8 + i % 10}:30 from pier {i % 4}", start + step * i) for i in range(n)]
            per_day[day] = per_day.get(day, 0) + retention_store.seed_exchanges(conn, sid, "bench", f"c{chat}", exchanges)
            pending += n
            if pending >= BUILD_BATCH_PAIRS:
                db_store.commit(conn)
                db_store.checkpoint(conn, "TRUNCATE")
                db_store.begin(conn)
                pending = 0
        db_store.commit(conn)
        db_store.checkpoint(conn, "TRUNCATE")
    finally:
        conn.close()
    return per_day


# ---------------------------------------------------------------- the run


class Producer:
    """Inbound turn writes at a steady rate (open loop); each ack's latency by the wall time it was sent."""

    def __init__(self, home, rate: float) -> None:
        self.home = home
        self.rate = rate
        self.records: list[tuple[float, float]] = []
        self.failed = 0
        self.stop = asyncio.Event()

    async def run(self) -> None:
        from common.errors import StarlingError
        from schema import messages as m

        async with self.home.client("bench", window=4096, deadline_s=120) as client:
            async def one(i: int) -> None:
                wall, t0 = time.time(), time.perf_counter()
                try:
                    await client.call(m.Inbound(agent="default", instance="bench", chat=f"live-{i % LIVE_CHATS}",
                                                sender="u", text=f"live message {i} about the weather",
                                                dedupe_keys=[f"bench:live:{i}"]))
                except StarlingError:
                    self.failed += 1
                    return
                self.records.append((wall, (time.perf_counter() - t0) * 1000))

            tasks: set[asyncio.Task] = set()
            due = time.monotonic()
            i = 0
            while not self.stop.is_set():
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                due += 1 / self.rate
                task = asyncio.create_task(one(i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
            await asyncio.gather(*tasks)


def swept_line(log_file: Path) -> dict | None:
    try:
        text = log_file.read_text(errors="replace")
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        if '"event":"retention_swept"' in line:
            return json.loads(line)
    return None


def stop_process(popen: subprocess.Popen, timeout: float = 20.0) -> int | None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(5)
    return popen.returncode


async def run(home, args, work: Path) -> dict:
    from tests.procs import _ping

    stats_file = work / "writer-stats.json"
    logs = home.paths.logs_dir
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(logs / "writer.log", "ab") as wlog:
        writer = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--as-writer", "--home",
                                   str(home.root), "--stats", str(stats_file)],
                                  stdout=wlog, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    sweeper = None
    try:
        if not await _ping(home, 120.0):
            raise RuntimeError(f"the writer did not answer:\n{(logs / 'writer.log').read_text()[-3000:]}")
        producer = Producer(home, args.rate)
        producing = asyncio.create_task(producer.run())
        await asyncio.sleep(args.baseline)
        baseline_end = time.time()
        with open(logs / "sweeper.log", "ab") as slog:
            sweeper = subprocess.Popen([sys.executable, "-m", "services.sweeper", "--home", str(home.root)],
                                       stdout=slog, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        print(f"writer pid {writer.pid}, sweeper pid {sweeper.pid}; producing {args.rate:g} turns/s", flush=True)
        deadline = time.monotonic() + SWEEP_TIMEOUT_S
        swept = None
        while swept is None:
            if time.monotonic() > deadline or sweeper.poll() is not None or writer.poll() is not None:
                raise RuntimeError("no retention pass:\n" + (logs / "sweeper.log").read_text()[-3000:])
            await asyncio.sleep(0.05)
            swept = swept_line(logs / "sweeper.log")
        await asyncio.sleep(1.0)
        producer.stop.set()
        await producing
    finally:
        if sweeper is not None:
            stop_process(sweeper)
        writer_rc = stop_process(writer)
    if writer_rc != 0 or not stats_file.exists():
        raise RuntimeError(f"the writer exited with {writer_rc}:\n{(logs / 'writer.log').read_text()[-3000:]}")
    stats = json.loads(stats_file.read_text())
    return {"swept": swept, "producer": producer, "baseline_end": baseline_end, "stats": stats}


def remaining_turns(home) -> int:
    from common import db
    from common.stores import retention_store

    reader = db.open_reader(home.paths.db_file)
    try:
        with db.read_tx(reader) as conn:
            return retention_store.remaining(conn)["turns"]
    finally:
        reader.close()


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1_000_000, help="turns in the database before the sweep")
    parser.add_argument("--days", type=int, default=60, help="days of history")
    parser.add_argument("--keep-days", type=int, default=30, help="[retention] session_days of the sweep")
    parser.add_argument("--chats", type=int, default=200, help="chats, each with a conversation a day")
    parser.add_argument("--rate", type=float, default=100.0, help="live turn writes per second during the run")
    parser.add_argument("--baseline", type=float, default=3.0, help="seconds of live writes before the sweep")
    parser.add_argument("--keep", action="store_true", help="keep the temporary home (printed)")
    parser.add_argument("--as-writer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.as_writer:
        return writer_with_timing(args.home, args.stats)
    if args.turns < 2 or args.days < 2 or not 0 < args.keep_days < args.days or args.chats < 1 or args.rate <= 0:
        print("--turns >= 2, --days >= 2, 0 < --keep-days < --days, --chats >= 1 and --rate > 0", file=sys.stderr)
        return 2

    import tempfile

    from tests.procs import make_home, remove_home

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # so that every process is stopped and the home removed

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    home = make_home(f"[retention]\nsession_days = {args.keep_days}\n"
                     "[health]\nheartbeat_interval_ms = 1000\ndisk_warn_threshold_mb = 1\n")
    work = Path(tempfile.mkdtemp(prefix="stbs", dir="/tmp"))
    try:
        now = time.time()
        t0 = time.monotonic()
        per_day = build(home, args, now)
        built = sum(per_day.values())
        size = home.paths.db_file.stat().st_size
        print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load avg "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"built {built:,} turns ({args.chats} chats x {args.days} days, each answer with its outbox row)"
              f" in {time.monotonic() - t0:.1f}s; database {size / 2**20:,.0f} MB")
        result = asyncio.run(run(home, args, work))

        swept, producer, stats = result["swept"], result["producer"], result["stats"]
        end = datetime.fromisoformat(swept["ts"].replace("Z", "+00:00")).timestamp()
        start = end - swept["seconds"]
        during = sorted(ms for wall, ms in producer.records if start <= wall <= end)
        baseline = sorted(ms for wall, ms in producer.records if wall < result["baseline_end"])
        txs = [ms for wall, ms, _cpu in stats["transactions"] if start <= wall <= end]
        tx_cpu = [cpu for wall, _ms, cpu in stats["transactions"] if start <= wall <= end]
        cps = [(ms, mode) for wall, ms, mode in stats["checkpoints"] if start <= wall <= end]
        expected = sum(n for day, n in per_day.items() if day >= args.keep_days)
        left = remaining_turns(home)
        produced = len(producer.records)
        verdict = "OK" if (swept["rows"].get("turns", 0), left) == (expected, built - expected + produced) else "MISMATCH"

        rows = swept["rows"]
        print(f"sweep: {swept['seconds']:.1f}s, {swept['steps']} steps; deleted {rows.get('sessions', 0):,} sessions,"
              f" {rows.get('turns', 0):,} turns, {rows.get('outbox', 0):,} outbox rows"
              f" ({rows.get('turns', 0) / max(swept['seconds'], 1e-9):,.0f} turns/s)")
        print(f"write transactions during the sweep: {len(txs):,}; longest {max(txs, default=0):.1f} ms"
              f" (p99 {percentile(sorted(txs), 99):.1f} ms); the most CPU the writer spent in one"
              f" {max(tx_cpu, default=0):.1f} ms (the rest of the longest is waiting: disk, other processes);"
              f" longest purge step inside one {swept['longest_step_ms']:.1f} ms")
        if cps:
            longest_cp = max(cps)
            print(f"checkpoints during the sweep: {len(cps)}; longest {longest_cp[0]:.1f} ms ({longest_cp[1]})")
        print(f"turn writes at {args.rate:g}/s: during the sweep ({len(during):,}) p50 {percentile(during, 50):.1f}"
              f"  p99 {percentile(during, 99):.1f}  max {max(during, default=0):.1f} ms;"
              f" baseline ({len(baseline):,}) p50 {percentile(baseline, 50):.1f}  p99 {percentile(baseline, 99):.1f} ms;"
              f" failed {producer.failed}")
        print(f"turns deleted {rows.get('turns', 0):,}, expected {expected:,} (days >= {args.keep_days});"
              f" left {left:,} = {built - expected:,} kept + {produced:,} live -> {verdict}")
        met = targets.judge(targets.below("longest_write_tx", max(txs, default=0), TARGET_LONGEST_TX_MS, " ms", ".1f",
                                          label=f"longest write transaction < {TARGET_LONGEST_TX_MS:g} ms"))
        if args.keep:
            print(f"kept: home {home.root}")
        return targets.last_line({
            "turns": built,
            "sweep_s": round(swept["seconds"], 2),
            "turns_deleted": rows.get("turns", 0),
            "longest_write_tx_ms": round(max(txs, default=0), 1),
            "longest_write_tx_cpu_ms": round(max(tx_cpu, default=0), 1),
            "longest_purge_step_ms": round(swept["longest_step_ms"], 1),
            "longest_checkpoint_ms": round(max(cps)[0], 1) if cps else 0.0,
            "turn_write_p99_ms": round(percentile(during, 99), 1),
            "turn_write_max_ms": round(max(during, default=0), 1),
            "baseline_p99_ms": round(percentile(baseline, 99), 1),
            "turns_ok": verdict == "OK",
            "failed_writes": producer.failed,
        }, met, checks_ok=verdict == "OK" and producer.failed == 0)
    finally:
        if not args.keep:
            remove_home(home)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; every process stopped, the temporary home removed", file=sys.stderr)
        sys.exit(130)
