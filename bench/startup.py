"""Startup benchmark: seconds from `starling up` to every service ready, and idle RSS of all processes.

Five runs, each in a fresh home (`starling init`, 2 runners, no gateway), median reported.
Last line: {"ready_s_median": ..., "rss_mb_median": ..., "rss_mb_services_median": ..., "pss_mb_median": ...,
"runs": 5}. RSS counts shared pages once per process; PSS splits them, so it is the memory really used.
Targets (issue 3): ready in under 2 s; under 250 MB RSS in total.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common.config import load_config  # noqa: E402
from common.home import paths_for  # noqa: E402
from common.supervisor import Supervisor  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def starling(home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def rss_kb(pid: int) -> int:
    return _proc_kb(f"/proc/{pid}/status", "VmRSS:")


def pss_kb(pid: int) -> int:
    """Proportional set size: shared pages (libpython, libzmq) split among the processes sharing them."""
    return _proc_kb(f"/proc/{pid}/smaps_rollup", "Pss:")


def _proc_kb(path: str, field: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(idle_s: float) -> dict:
    home = Path(tempfile.mkdtemp(prefix="stb", dir="/tmp"))
    try:
        init = starling(home, "init")
        if init.returncode:
            raise SystemExit(f"init failed: {init.stderr}")
        config = home / "config.toml"
        config.write_text(config.read_text().replace('listen = "127.0.0.1:7820"', f'listen = "127.0.0.1:{free_port()}"'))
        started = time.perf_counter()
        up = starling(home, "up")
        ready_s = time.perf_counter() - started
        if up.returncode:
            raise SystemExit(f"up failed:\n{up.stdout}\n{up.stderr}")
        time.sleep(idle_s)
        sup = Supervisor(paths_for(home, load_config(config)))
        pids = {p.name: p.pid for p in sup.processes() if p.pid}
        services = {name: rss_kb(pid) for name, pid in pids.items()}
        daemon = rss_kb(sup.supervisord_pid())
        pss = sum(pss_kb(pid) for pid in [*pids.values(), sup.supervisord_pid()])
        return {"ready_s": ready_s, "services_kb": services, "supervisord_kb": daemon, "pss_kb": pss}
    finally:
        starling(home, "down")
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=3.0, help="seconds idle before RSS is read")
    args = parser.parse_args()
    runs = [one_run(args.idle) for _ in range(args.runs)]
    for n, run in enumerate(runs, 1):
        total = (sum(run["services_kb"].values()) + run["supervisord_kb"]) / 1024
        print(f"run {n}: ready in {run['ready_s']:.2f}s; RSS {total:.0f} MB in total "
              f"(supervisord {run['supervisord_kb'] / 1024:.0f} MB; "
              + ", ".join(f"{k} {v / 1024:.0f}" for k, v in sorted(run["services_kb"].items()))
              + f"); PSS {run['pss_kb'] / 1024:.0f} MB in total")
    ready = statistics.median(r["ready_s"] for r in runs)
    total = statistics.median((sum(r["services_kb"].values()) + r["supervisord_kb"]) / 1024 for r in runs)
    services = statistics.median(sum(r["services_kb"].values()) / 1024 for r in runs)
    pss = statistics.median(r["pss_kb"] / 1024 for r in runs)
    print(f"median of {len(runs)}: ready in {ready:.2f}s (target < 2 s); RSS {total:.0f} MB with supervisord, "
          f"{services:.0f} MB for the services alone (target < 250 MB); PSS {pss:.0f} MB; {os.cpu_count()} cores")
    print(json.dumps({"ready_s_median": round(ready, 3), "rss_mb_median": round(total, 1),
                      "rss_mb_services_median": round(services, 1), "pss_mb_median": round(pss, 1),
                      "runs": len(runs)}))


if __name__ == "__main__":
    main()
