"""Writer benchmark: acked turn writes per second through the bus, against the raw SQLite limit.

    python bench/writer.py [--seconds 10] [--producers 4] [--concurrency 32] [--ops-per-call 1]
    python -m bench.writer ...

1. A real writer process in a fresh temporary home, and N producer processes (default 4), each
   one asyncio loop with one WriterClient sending ``Inbound`` writes (short text turns, so the
   FTS triggers fire) with at most ``--concurrency`` calls in flight, for ``--warmup`` seconds
   unmeasured and then ``--seconds`` measured. The measured window starts at the same instant in
   every producer (a start time handed out once all of them are connected). Throughput counts the
   acks that arrived inside the window; latency is call start -> result, for calls started inside it.
   A call is one write, or with ``--ops-per-call N`` N writes sent together as a client that has
   several does (a Telegram getUpdates batch: ``WriterClient.call_many``, one frame, one commit),
   its latency the time to the last of them.
2. The same rows (same 80 sessions, same texts) inserted by this process directly with apsw in
   1,000-row transactions: what a bus write stores, each turn with its inbound_keys row (its dedupe
   key) and its session's last_active_at touched, through the same indexes and FTS triggers, under
   the writer's pragmas (``db.open_writer``: WAL, synchronous=FULL) and the writer's checkpoint
   policy: the physical limit of this machine.
3. The number of turns in the bus run's database is checked against the number of acked writes.

The last line of output is one JSON object:
{"bus_writes_per_s": ..., "raw_rows_per_s": ..., "ratio": ..., "p99_ack_ms": ..., "targets_met": ...}
Target (issue 2): ratio >= 0.5 and p99 ack < 20 ms at that load; exit status 1 when missed (bench/targets.py).
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
import tempfile  # noqa: E402
import time  # noqa: E402

from bench import targets  # noqa: E402

CHATS_PER_PRODUCER = 20
RAW_BATCH = 1000
START_SLACK_S = 0.3  # between handing out the start time and the warm-up's first write
READY_TIMEOUT_S = 60.0
AGENT, INSTANCE = "default", "bench"
TARGETS = {"ratio": 0.5, "p99_ack_ms": 20.0}  # issue 2, at this load


def chat_name(producer: int, i: int) -> str:
    return f"p{producer}-c{i % CHATS_PER_PRODUCER}"


def sender_name(producer: int, i: int) -> str:
    return f"u{producer}-{i % CHATS_PER_PRODUCER}"


def turn_text(producer: int, i: int) -> str:
    return f"turn {i} from producer {producer} about retries"


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), int(-(-q * len(sorted_values) // 100))))
    return sorted_values[rank - 1]


# ---------------------------------------------------------------- producer process


def open_home(root: Path):
    """The Home of an existing directory, read as it is (the parent made it; never rewritten here)."""
    from common import bus
    from common.config import load_config
    from common.home import paths_for
    from common.secrets import session_secret
    from tests.procs import Home

    cfg = load_config(root / "config.toml")
    paths = paths_for(root, cfg)
    key = bus.bus_key(session_secret(paths))
    return Home(root, cfg, paths, key, bus.endpoints(paths.run_dir, cfg.bus.writer_endpoint, cfg.bus.events_endpoint))


async def produce(args: argparse.Namespace) -> dict:
    from common.errors import BusTimeout, WriteRejected
    from schema import messages as m

    home = open_home(Path(args.home))
    work = Path(args.work)
    producer = args.producer
    result = {
        "producer": producer, "acked": 0, "in_window": 0, "duplicates": 0, "rejected": 0, "timeouts": 0,
        "latencies_ms": [], "resent": 0, "late_acks": 0, "first_ping_ms": 0.0,
    }
    async with home.client(f"bench{producer}", window=max(256, args.concurrency * args.ops_per_call)) as client:
        t0 = time.monotonic()
        if not await client.ping(20.0):
            raise SystemExit(f"producer {producer}: the writer did not answer a ping in 20s")
        result["first_ping_ms"] = round((time.monotonic() - t0) * 1000, 1)
        (work / f"ready.{producer}").touch()
        start_file = work / "start"
        give_up = time.monotonic() + READY_TIMEOUT_S
        while not start_file.exists():
            if time.monotonic() > give_up:
                raise SystemExit(f"producer {producer}: no start time in {READY_TIMEOUT_S:.0f}s")
            await asyncio.sleep(0.005)
        start = float(start_file.read_text())  # time.monotonic() is one clock for every process on Linux
        end = start + args.seconds
        await asyncio.sleep(max(0.0, start - args.warmup - time.monotonic()))

        counter = iter(range(10**12))
        latencies = result["latencies_ms"]

        def write(i: int) -> m.Inbound:
            return m.Inbound(
                agent=AGENT, instance=INSTANCE, chat=chat_name(producer, i), sender=sender_name(producer, i),
                text=turn_text(producer, i), dedupe_keys=[f"bench:{producer}:{i}"],
            )

        async def worker() -> None:
            while True:
                t0 = time.monotonic()
                if t0 >= end:
                    return
                ops = [write(next(counter)) for _ in range(args.ops_per_call)]
                if len(ops) == 1:
                    try:
                        answers = [await client.call(ops[0])]
                    except (WriteRejected, BusTimeout) as exc:
                        answers = [exc]
                else:
                    answers = await client.call_many(ops)
                t1 = time.monotonic()
                for res in answers:
                    if isinstance(res, WriteRejected):
                        result["rejected"] += 1
                    elif isinstance(res, BusTimeout):
                        result["timeouts"] += 1
                    else:
                        result["acked"] += 1
                        result["duplicates"] += getattr(res, "duplicate", False)
                        result["in_window"] += start <= t1 < end
                if start <= t0 < end:
                    latencies.append(round((t1 - t0) * 1000, 3))

        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        result["resent"] = client.stats.resent
        result["late_acks"] = client.stats.late_acks
    return result


def producer_main(args: argparse.Namespace) -> int:
    try:
        result = asyncio.run(produce(args))
    except KeyboardInterrupt:
        return 130
    out = Path(args.work) / f"result.{args.producer}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    os.replace(tmp, out)
    return 0


# ---------------------------------------------------------------- bus run (parent)


def stop_process(popen: subprocess.Popen, timeout: float = 5.0) -> None:
    if popen.poll() is None:
        popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(timeout)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(5)


def watch(writer, producers: list[subprocess.Popen], until: float, all_done: bool = False, logs=lambda: "") -> bool:
    """Sleep until ``until`` (or, with ``all_done``, until every producer exited: True); fail fast when
    the writer dies or a producer fails."""
    while time.monotonic() < until:
        if not writer.alive():
            raise RuntimeError(f"the writer exited with {writer.popen.returncode}:\n{writer.log_text()[-3000:]}")
        codes = [popen.poll() for popen in producers]
        if any(code not in (None, 0) for code in codes):
            raise RuntimeError(f"a producer failed: exit codes {codes}\n{logs()}")
        if all_done and all(code == 0 for code in codes):
            return True
        time.sleep(min(0.05, max(0.0, until - time.monotonic())))
    return not all_done


def run_bus(args: argparse.Namespace, home, work: Path) -> dict:
    from common import db
    from common.stores import turn_store
    from tests.procs import start_writer

    writer = start_writer(home)
    producers: list[subprocess.Popen] = []
    logs = []
    try:
        for n in range(args.producers):
            log = open(work / f"producer.{n}.log", "wb")
            logs.append(log)
            producers.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--producer", str(n), "--home", str(home.root),
                 "--work", str(work), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
                 "--concurrency", str(args.concurrency), "--ops-per-call", str(args.ops_per_call)],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            ))
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all((work / f"ready.{n}").exists() for n in range(args.producers)):
            failed = [n for n, p in enumerate(producers) if p.poll() is not None]
            if failed or time.monotonic() > deadline:
                raise RuntimeError(f"producers not ready (exited: {failed}):\n" + _logs(work, args.producers))
            time.sleep(0.01)
        start = time.monotonic() + START_SLACK_S + args.warmup
        (work / "start.tmp").write_text(repr(start))
        os.replace(work / "start.tmp", work / "start")
        print(f"writer pid {writer.pid}, producer pids {[p.pid for p in producers]};"
              f" warm-up {args.warmup:g}s, measuring {args.seconds:g}s ...", flush=True)

        def show_logs() -> str:
            return _logs(work, args.producers)

        pids = {"writer": writer.pid, **{f"producer {n}": popen.pid for n, popen in enumerate(producers)}}
        watch(writer, producers, until=start, logs=show_logs)
        cpu_before, t_before = cpu_seconds(pids), time.monotonic()
        watch(writer, producers, until=start + args.seconds, logs=show_logs)
        cpu_after, t_after = cpu_seconds(pids), time.monotonic()
        cpu = {name: (cpu_after[name] - cpu_before[name]) / (t_after - t_before)
               for name in pids if name in cpu_before and name in cpu_after}
        # then the producers drain their calls in flight (each bounded by the client's deadline)
        if not watch(writer, producers, until=start + args.seconds + 90, all_done=True, logs=show_logs):
            raise RuntimeError("producers did not finish in 90s:\n" + _logs(work, args.producers))

        results = []
        for n, popen in enumerate(producers):
            out = work / f"result.{n}.json"
            if popen.returncode != 0 or not out.exists():
                raise RuntimeError(f"producer {n} failed (exit {popen.returncode}):\n" + _logs(work, args.producers))
            results.append(json.loads(out.read_text()))

        reader = db.open_reader(home.paths.db_file)
        try:
            with db.read_tx(reader):
                turns_in_db = turn_store.count(reader)
        finally:
            reader.close()
    finally:
        for popen in producers:
            stop_process(popen)
        for log in logs:
            log.close()
        writer_rc = writer.stop()
    if writer_rc not in (0, None):
        print(f"warning: the writer exited with {writer_rc}:\n{writer.log_text()[-2000:]}", file=sys.stderr)
    return {"results": results, "turns_in_db": turns_in_db, "writer_pid": writer.pid, "cpu": cpu}


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU time (user + system, all threads) of each process so far; Linux /proc, empty elsewhere."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        found[name] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return found


def _logs(work: Path, count: int) -> str:
    parts = []
    for n in range(count):
        f = work / f"producer.{n}.log"
        if f.exists():
            parts.append(f"--- producer {n}\n" + f.read_text(errors="replace")[-3000:])
    return "\n".join(parts)


# ---------------------------------------------------------------- raw baseline


class _QuietLog:
    def info(self, *a, **kw) -> None:
        pass

    warning = error = info


def run_raw(args: argparse.Namespace, cfg, rows_target: int, raw_dir: Path) -> dict:
    """The same rows by one process, straight into SQLite in 1,000-row transactions; rows/s."""
    from common import db
    from common.stores import db_store, keys_store, schema_store, session_store, turn_store
    from services.writer.maintenance import Maintenance

    db_file = raw_dir / "data" / "starling.db"
    conn = db.open_writer(db_file)
    try:
        schema_store.migrate(conn, db_file)
        settings = db_store.settings(conn)
        now = time.time()
        sessions = {}
        db_store.begin(conn)
        for p in range(args.producers):
            for c in range(CHATS_PER_PRODUCER):
                sessions[(p, c)] = session_store.open_session(conn, AGENT, INSTANCE, chat_name(p, c), now)
        db_store.commit(conn)
        # the writer's checkpoint policy (PASSIVE as the WAL grows, TRUNCATE past its bound)
        maint = Maintenance(conn, db_file, cfg.writer.checkpoint_interval_s, cfg.writer.wal_truncate_mb, _QuietLog())

        rows = 0
        elapsed = 0.0
        i = 0
        while rows < rows_target or elapsed < args.raw_min_seconds:
            batch, keys, touches = [], [], []
            for _ in range(RAW_BATCH):
                p = i % args.producers
                j = i // args.producers
                session_id = sessions[(p, j % CHATS_PER_PRODUCER)]
                batch.append((session_id, turn_text(p, j), sender_name(p, j), now))
                keys.append((f"bench:{p}:{j}", rows + len(batch), now))  # the turn's id: a fresh table, ids from 1
                touches.append((now, session_id))
                i += 1
            t0 = time.perf_counter()  # timed: the transaction and the checkpoint policy, not building tuples
            db_store.begin(conn)
            session_store.touch_many(conn, touches)
            turn_store.insert_raw(conn, batch)
            keys_store.remember_inbound_many(conn, keys)
            db_store.commit(conn)
            maint.after_commit()
            elapsed += time.perf_counter() - t0
            if conn.last_insert_rowid() != rows + len(batch):  # the inbound keys named the right turns
                raise RuntimeError(f"raw baseline: turn ids not from 1 (last {conn.last_insert_rowid()})")
            rows += len(batch)
            if rows >= 50 * rows_target:  # safety bound
                break
        with db.read_tx(conn):
            stored = turn_store.count(conn)
    finally:
        conn.close()
    return {"rows": rows, "seconds": elapsed, "rows_per_s": rows / elapsed, "stored": stored, "settings": settings}


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured duration of the bus run")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured writes before the window")
    parser.add_argument("--producers", type=int, default=4, help="producer processes")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight per producer")
    parser.add_argument("--ops-per-call", type=int, default=1,
                        help="writes per call (WriterClient.call_many: one frame, in order, one commit)")
    parser.add_argument("--raw-min-rows", type=int, default=200_000,
                        help="the raw baseline inserts at least this many rows (and at least what the bus committed)")
    parser.add_argument("--raw-min-seconds", type=float, default=3.0,
                        help="... and runs at least this long")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories (printed)")
    # internal: run as one producer
    parser.add_argument("--producer", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.producer is not None:
        return producer_main(args)
    if args.producers < 1 or args.concurrency < 1 or args.seconds <= 0:
        print("--producers, --concurrency and --seconds must be positive", file=sys.stderr)
        return 2

    from tests.procs import make_home, remove_home

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # so that every process is stopped and the temp dirs removed

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started with SIGINT ignored
    home = make_home()
    work = Path(tempfile.mkdtemp(prefix="stbw", dir="/tmp"))
    raw_dir = Path(tempfile.mkdtemp(prefix="stbr", dir="/tmp"))
    try:
        bus_run = run_bus(args, home, work)
        results = sorted(bus_run["results"], key=lambda r: r["producer"])
        acked = sum(r["acked"] for r in results)
        in_window = sum(r["in_window"] for r in results)
        latencies = sorted(x for r in results for x in r["latencies_ms"])
        bus_rate = in_window / args.seconds

        raw = run_raw(args, home.cfg, max(acked, args.raw_min_rows), raw_dir)
        ratio = bus_rate / raw["rows_per_s"]
        p50, p90, p99 = (percentile(latencies, q) for q in (50, 90, 99))

        print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}, load avg "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"bus: {args.producers} producers x {args.concurrency} in flight, {args.seconds:g}s measured"
              f" after {args.warmup:g}s warm-up")
        print(f"bus writes/s: {bus_rate:,.0f}  ({in_window:,} acks in the window)")
        for r in results:
            print(f"  producer {r['producer']}: {r['in_window']:,} in window, {r['acked']:,} acked in all,"
                  f" duplicates {r['duplicates']}, rejected {r['rejected']}, timeouts {r['timeouts']},"
                  f" resent {r['resent']}, late acks {r['late_acks']}, first ping {r['first_ping_ms']:.0f} ms")
        print(f"ack latency ms ({len(latencies):,} calls): p50 {p50:.2f}  p90 {p90:.2f}  p99 {p99:.2f}"
              f"  max {latencies[-1] if latencies else 0:.2f}")
        cpu = bus_run["cpu"]
        if cpu:
            print("CPU in the window (share of one core): "
                  + ", ".join(f"{name} {share:.0%}" for name, share in cpu.items())
                  + f"; total {sum(cpu.values()):.2f} of {os.cpu_count()} cores")
        verdict = "OK" if bus_run["turns_in_db"] == acked else "MISMATCH"
        print(f"turns in the bus database: {bus_run['turns_in_db']:,}; acked writes: {acked:,} -> {verdict}")
        pragmas = " ".join(f"{k}={v}" for k, v in raw["settings"].items())
        print(f"raw apsw ({RAW_BATCH}-row transactions, {pragmas}): {raw['rows_per_s']:,.0f} rows/s"
              f"  ({raw['rows']:,} rows in {raw['seconds']:.2f}s; {raw['stored']:,} stored)")
        print(f"ratio bus/raw: {ratio:.3f}")
        met = targets.judge(targets.at_least("ratio", ratio, TARGETS["ratio"], fmt=".3f"),
                            targets.below("p99_ack", p99, TARGETS["p99_ack_ms"], " ms"))
        if args.keep:
            print(f"kept: home {home.root}, work {work}, raw {raw_dir}")
        return targets.last_line({
            "bus_writes_per_s": round(bus_rate, 1),
            "raw_rows_per_s": round(raw["rows_per_s"], 1),
            "ratio": round(ratio, 4),
            "p99_ack_ms": round(p99, 2),
            "rows_ok": verdict == "OK",
        }, met, checks_ok=verdict == "OK")
    finally:
        if not args.keep:
            remove_home(home)
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(raw_dir, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted; every process stopped, temporary directories removed", file=sys.stderr)
        sys.exit(130)
