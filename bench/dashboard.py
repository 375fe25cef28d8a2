"""The dashboard's cost: time to first byte of every page (p50/p95) with 100,000 turns in 1,000 sessions (and a
usage row per answer, some daemon log) in the database, and the control service's RSS with the dashboard
against the same service with ``[control] dashboard = false``.

Targets: p95 < 150 ms for every page; RSS growth < 15 MB. The last line is one JSON object (bench/targets.py);
exit 1 when a target is missed or a page did not answer 200.

    python bench/dashboard.py [--turns 100000] [--sessions 1000] [--requests 40]
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import asyncio  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402

import aiohttp  # noqa: E402

from bench import targets  # noqa: E402

PASSWORD = "a benchmark password"
P95_MS = 150.0
RSS_MB = 15.0
DAY = 86400.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port: int, dashboard: bool) -> str:
    return f'[control]\nlisten = "127.0.0.1:{port}"\ndashboard = {"true" if dashboard else "false"}\n'


def build(home, turns: int, sessions: int, now: float) -> int:
    """The history, written straight into a fresh database (as bench/sweep.py does); the first session's id."""
    from common import db
    from common.stores import audit_store, db_store, retention_store, schema_store

    conn = db.open_writer(home.paths.db_file)
    first = 0
    try:
        schema_store.migrate(conn, home.paths.db_file)
        per_session = max(1, turns // 2 // sessions)
        db_store.begin(conn)
        for n in range(sessions):
            start = now - (n % 30 + 1) * DAY
            chat = f"c{n}"
            sid = retention_store.seed_session(conn, "default", "bench", chat, start, start + per_session * 60)
            first = first or sid
            exchanges = [(f"session {n} message {i}: when does the ferry to the island leave",
                          f"the ferry leaves at {8 + i % 10}:30 from pier {i % 4}", start + i * 60)
                         for i in range(per_session)]
            retention_store.seed_exchanges(conn, sid, "bench", chat, exchanges)
            for i in range(0, per_session, 5):  # a model call for every fifth answer
                audit_store.record_usage(conn, sid, 0, "default", "default", "gpt-4o-mini", 900 + i, 120, 0.0004,
                                         start + i * 60)
            if n % 100 == 99:
                db_store.commit(conn)
                db_store.begin(conn)
        db_store.commit(conn)
        db_store.checkpoint(conn, "TRUNCATE")
    finally:
        conn.close()
    return first


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def wait_up(base: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.get(base + "/livez") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"the control service at {base} did not answer in {timeout:.0f}s")


async def idle_rss(home, proc, base: str) -> float:
    await wait_up(base)
    async with aiohttp.ClientSession() as s:
        for _ in range(20):
            async with s.get(base + "/health") as r:
                await r.read()
    await asyncio.sleep(0.5)
    return rss_mb(proc.pid)


async def measure(base: str, pages: list[str], requests: int) -> tuple[dict, list[str], float]:
    """{page: (p50 ms, p95 ms)} of time to first byte, pages that failed, and the seconds it took."""
    figures, failed = {}, []
    started = time.monotonic()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        async with s.get(base + "/login") as r:
            token = re.search(r'name="csrf" value="([^"]+)"', await r.text())[1]
        async with s.post(base + "/login", data={"csrf": token, "name": "bench", "password": PASSWORD},
                          allow_redirects=False) as r:
            if r.status != 303:
                raise RuntimeError(f"login failed: HTTP {r.status}")
        for page in pages:
            times = []
            for _ in range(requests):
                t = time.perf_counter()
                async with s.get(base + page, allow_redirects=False) as r:
                    times.append((time.perf_counter() - t) * 1000)  # the headers are in: the first byte came
                    await r.read()
                    if r.status != 200:
                        failed.append(f"{page}: HTTP {r.status}")
                        break
            times.sort()
            figures[page] = (times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.95))])
    return figures, failed, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=40, help="requests per page")
    args = parser.parse_args(argv)

    from common import dashboard_accounts as accounts
    from common.personas import create_pack
    from schema import messages as m
    from tests.procs import Proc, make_home, remove_home, start_writer

    port = free_port()
    home = make_home(config(port, dashboard=False))
    base = f"http://127.0.0.1:{port}"
    procs = []
    try:
        now = time.time()
        t = time.monotonic()
        first_session = build(home, args.turns, args.sessions, now)
        print(f"built {args.turns} turns in {args.sessions} sessions in {time.monotonic() - t:.1f}s", flush=True)
        create_pack(home.paths, "default")
        procs.append(start_writer(home))

        async def account():
            async with home.client("bench") as c:
                await c.call(m.DashboardAccount(action="add", username="bench", role="admin", by="bench",
                                                password_hash=accounts.hash_password(PASSWORD)))

        asyncio.run(account())
        plain = Proc(home, "control")
        without = asyncio.run(idle_rss(home, plain, base))
        plain.stop()
        (home.root / "config.toml").write_text(config(port, dashboard=True))
        control = Proc(home, "control")
        procs.append(control)
        with_idle = asyncio.run(idle_rss(home, control, base))
        pages = ["/", "/conversations", "/conversations?q=ferry+island", f"/conversations/{first_session}",
                 "/approvals", "/access", "/cron", "/agents", "/agents/default", "/secrets", "/usage",
                 "/usage?days=90", "/logs", "/logs?source=db", "/whatsapp"]
        figures, failed, seconds = asyncio.run(measure(base, pages, args.requests))
        with_used = rss_mb(control.pid)
        alive = all(p.alive() for p in procs)
    finally:
        for proc in reversed(procs):
            proc.stop()
        remove_home(home)

    width = max(len(p) for p in figures)
    for page, (p50, p95) in figures.items():
        print(f"{page.ljust(width)}  ttfb p50 {p50:6.1f} ms  p95 {p95:6.1f} ms", flush=True)
    growth = with_used - without
    print(f"control RSS: {without:.1f} MB without the dashboard, {with_idle:.1f} MB with it idle, {with_used:.1f} MB"
          f" after {len(pages) * args.requests} page loads ({seconds:.1f}s); growth {growth:.1f} MB", flush=True)
    for line in failed:
        print(f"failed: {line}", flush=True)
    worst_page, (_, worst) = max(figures.items(), key=lambda item: item[1][1])
    met = targets.judge(
        targets.below("p95_ms", worst, P95_MS, " ms", ".1f", label=f"p95 < {P95_MS:g} ms on every page ({worst_page})"),
        targets.below("rss_growth_mb", growth, RSS_MB, " MB", ".1f", label=f"RSS growth < {RSS_MB:g} MB"),
    )
    return targets.last_line({
        "turns": args.turns, "sessions": args.sessions, "requests_per_page": args.requests,
        "pages": {page: {"p50_ms": round(p50, 2), "p95_ms": round(p95, 2)} for page, (p50, p95) in figures.items()},
        "rss_mb": {"without_dashboard": round(without, 1), "with_dashboard_idle": round(with_idle, 1),
                   "with_dashboard_used": round(with_used, 1)},
        "rss_growth_mb": round(growth, 1), "failed": failed,
    }, met, checks_ok=not failed and alive)


if __name__ == "__main__":
    sys.exit(main())
