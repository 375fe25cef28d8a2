"""Startup benchmark: seconds from `starling up` to every service ready, and idle RSS and PSS of all processes.

    python bench/startup.py [--runs 5] [--idle 3]

Each run in a fresh home: `starling init` (2 runners), one Telegram gateway in long-polling mode against the
fake Bot API (tests/fake_telegram.py, one process for all runs, not counted), `starling up` timed until it
returns (every service ready), then ``--idle`` s idle. Counted: supervisord and every process under it
(found by walking /proc from supervisord's pid, so a service's children count too). Each service `up` waits
for must still be RUNNING with the pid it had when `up` returned: a service that crashed (exited, restarted by
supervisord, or vanished before its memory was read) fails the run; it is never counted as zero.
RSS counts shared pages once per process; PSS splits them among the processes sharing them, so it is the
memory really used. Medians over the runs.

Targets (issue 3): ready in under 2 s; under 250 MB RSS in total (supervisord and every process under it).
The last line is one JSON object: {"ready_s_median": ..., "rss_mb_median": ..., "pss_mb_median": ...,
"rss_mb_services_median": ..., "processes": ..., "runs": ..., "targets": {...}, "targets_met": ...}.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import targets  # noqa: E402
from common.config import load_config  # noqa: E402
from common.home import paths_for  # noqa: E402
from common.supervisor import Supervisor, expected_services  # noqa: E402

TARGETS = {"ready_s": 2.0, "rss_mb": 250.0}
TELEGRAM = '''
[[gateways.telegram]]
id = "bench"
agent = "default"
token = "tg-token"
mode = "polling"
api_base = "{url}"
'''


class RunFailed(Exception):
    """A run that cannot be counted: a step failed or a service crashed."""


def starling(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home), *args], cwd=REPO,
                          input=stdin, capture_output=True, text=True, timeout=120)


def proc_kb(pid: int, path: str, field: str) -> int | None:
    """A kB field of /proc/<pid>/<path>; None when the process is gone."""
    try:
        with open(f"/proc/{pid}/{path}") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def descendants(root: int) -> list[int]:
    """``root`` and every process under it, from /proc's parent pids."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def comm(pid: int) -> str:
    try:
        return " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:4])
    except OSError:
        return "?"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(idle_s: float, tg_url: str, tg_token: str) -> dict:
    home = Path(tempfile.mkdtemp(prefix="stb", dir="/tmp"))
    try:
        init = starling(home, "init")
        if init.returncode:
            raise RunFailed(f"init failed: {init.stderr}")
        config = home / "config.toml"
        text = re.sub(r'(?m)^listen = "127\.0\.0\.1:\d+"', f'listen = "127.0.0.1:{free_port()}"',  # init's pick
                      config.read_text(), count=1)
        config.write_text(text + TELEGRAM.format(url=tg_url))
        secret = starling(home, "secret", "set", "tg-token", "--value-stdin", stdin=tg_token)
        if secret.returncode:
            raise RunFailed(f"secret set failed: {secret.stderr}")
        cfg = load_config(config)
        started = time.perf_counter()
        up = starling(home, "up")
        ready_s = time.perf_counter() - started
        if up.returncode:
            raise RunFailed(f"up failed:\n{up.stdout}\n{up.stderr}")
        sup = Supervisor(paths_for(home, cfg))
        wanted = expected_services(cfg)
        at_ready = {p.name: p.pid for p in sup.processes()}
        time.sleep(idle_s)
        now = {p.name: p for p in sup.processes()}
        daemon = sup.supervisord_pid()
        problems = [f"{name}: {now[name].state if name in now else 'missing'}"
                    f" (pid {at_ready.get(name, 0)} at ready, {now[name].pid if name in now else 0} now)"
                    for name in wanted
                    if name not in now or now[name].state != "RUNNING" or not now[name].pid
                    or now[name].pid != at_ready.get(name)]
        if daemon is None:
            problems.append("supervisord did not answer")
        if problems:
            raise RunFailed("a service crashed or is not running: " + "; ".join(problems))
        names = {p.pid: p.name for p in now.values() if p.pid}
        names[daemon] = "supervisord"
        rss, pss = {}, {}
        for pid in descendants(daemon):
            name = names.get(pid, f"pid {pid} ({comm(pid)})")
            r, p = proc_kb(pid, "status", "VmRSS:"), proc_kb(pid, "smaps_rollup", "Pss:")
            if r is None or p is None:
                raise RunFailed(f"{name} vanished before its memory was read")
            rss[name], pss[name] = r, p
        return {"ready_s": ready_s, "rss_kb": rss, "pss_kb": pss}
    finally:
        starling(home, "down")
        shutil.rmtree(home, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before memory is read")
    args = parser.parse_args()
    from tests.fake_telegram import DEFAULT_TOKEN, FakeTelegramProcess

    work = Path(tempfile.mkdtemp(prefix="stbt", dir="/tmp"))
    fake = FakeTelegramProcess(work, lifetime=3600).start()
    runs, failures = [], []
    try:
        for n in range(1, args.runs + 1):
            try:
                run = one_run(args.idle, fake.url, DEFAULT_TOKEN)
            except RunFailed as exc:
                failures.append(str(exc))
                print(f"run {n}: FAILED: {exc}", flush=True)
                continue
            runs.append(run)
            rss, pss = run["rss_kb"], run["pss_kb"]
            print(f"run {n}: ready in {run['ready_s']:.2f}s; {len(rss)} processes; RSS {sum(rss.values()) / 1024:.0f} MB,"
                  f" PSS {sum(pss.values()) / 1024:.0f} MB in total; RSS/PSS MB: "
                  + ", ".join(f"{k} {rss[k] / 1024:.0f}/{pss[k] / 1024:.0f}" for k in sorted(rss)), flush=True)
    finally:
        fake.stop()
        shutil.rmtree(work, ignore_errors=True)
    if not runs:
        met = targets.judge(targets.Target("ready_s", "every run", False, "none counted"))
        return targets.last_line({"runs": 0, "failed_runs": len(failures)}, met, checks_ok=False)
    ready = statistics.median(r["ready_s"] for r in runs)
    total = statistics.median(sum(r["rss_kb"].values()) / 1024 for r in runs)
    services = statistics.median(sum(v for k, v in r["rss_kb"].items() if k != "supervisord") / 1024 for r in runs)
    pss = statistics.median(sum(r["pss_kb"].values()) / 1024 for r in runs)
    counts = sorted({len(r["rss_kb"]) for r in runs})
    print(f"median of {len(runs)} runs ({len(failures)} failed): ready in {ready:.2f}s; RSS {total:.0f} MB in total"
          f" ({services:.0f} MB without supervisord); PSS {pss:.0f} MB; processes counted {counts};"
          f" {os.cpu_count()} cores, load avg {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    met = targets.judge(targets.below("ready_s", ready, TARGETS["ready_s"], " s"),
                        targets.below("rss_mb", total, TARGETS["rss_mb"], " MB RSS in total", ".1f"))
    return targets.last_line({
        "ready_s_median": round(ready, 3), "rss_mb_median": round(total, 1), "pss_mb_median": round(pss, 1),
        "rss_mb_services_median": round(services, 1), "processes": counts[-1], "runs": len(runs),
        "failed_runs": len(failures), "gateway": "telegram",
    }, met, checks_ok=not failures)


if __name__ == "__main__":
    sys.exit(main())
