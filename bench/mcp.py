"""MCP benchmark: what the runner's tool path adds to one MCP tool call, against the SDK calling the same server.

Two servers of tests/mcp_servers.py, each with a tool that answers at once (``echo``): over stdio (the runner
starts it confined, common/mcp_client.py; the direct client starts the same program with the SDK's own
stdio_client) and over Streamable HTTP (one server process, both clients on its URL). The runner's path is
``registry.execute`` with the agent's context: argument checks, the approval rule, the call with its timeout,
redaction and the size bound, exactly what a turn runs. The direct path is ``Client.call_tool``. Calls are
interleaved, so the machine's noise falls on both alike. Figures: p50 and p95 in ms of each, and the p50
added. Target (issue 15): under 5 ms added at p50, stdio and HTTP. Last line: one JSON object with
``targets_met``; exit 1 when a target is missed or an answer was wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

# run as a script, sys.path[0] is bench/, where this file would shadow the SDK's `mcp`: the repository instead
if Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(Path(__file__).resolve().parent.parent)
else:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import targets  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
SERVER = REPO / "tests" / "mcp_servers.py"
TARGET_ADDED_P50_MS = 5.0


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def start_http(folder: Path) -> tuple[subprocess.Popen, str]:
    port_file = folder / "mcp-port"
    proc = subprocess.Popen([sys.executable, str(SERVER), "http", "--port-file", str(port_file)], cwd=REPO)
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise SystemExit("the MCP HTTP server did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text()}/mcp"


async def measure(ctx, url: str, runs: int) -> tuple[dict[str, dict[str, list[float]]], int]:
    import httpx2
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client

    from services.runner.tools import mcp, registry

    times = {t: {"runner": [], "direct": []} for t in ("stdio", "http")}
    wrong = 0
    params = StdioServerParameters(command=sys.executable, args=[str(SERVER), "stdio"], cwd=str(REPO))
    try:
        _specs, problems = await registry.mcp_specs(ctx)
        if problems:
            raise SystemExit("; ".join(problems))
        async with httpx2.AsyncClient(timeout=30) as http, \
                Client(stdio_client(params, errlog=sys.stderr)) as direct_stdio, \
                Client(streamable_http_client(url, http_client=http)) as direct_http:
            direct = {"stdio": direct_stdio, "http": direct_http}
            for i in range(runs + 20):  # the first 20 of each warm up and are not counted
                for transport, tool in (("stdio", "s__echo"), ("http", "h__echo")):
                    for kind in ("runner", "direct"):
                        text = f"ping {i}"
                        started = time.perf_counter()
                        if kind == "runner":
                            result = await registry.execute(ctx, tool, {"text": text}, ["files"])
                            got = result.content if result.outcome == "ok" else f"({result.outcome}) {result.content}"
                        else:
                            answer = await direct[transport].call_tool("echo", {"text": text})
                            got = answer.content[0].text
                        took = (time.perf_counter() - started) * 1000
                        wrong += got != f"echo: {text}"
                        if i >= 20:
                            times[transport][kind].append(took)
    finally:
        await mcp.close_all()
    return times, wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()

    from common import sandbox
    from tests.procs import make_home, remove_home
    from tests.tool_helpers import make_ctx

    found = sandbox.probe()
    home = make_home()
    http_proc = None
    try:
        http_proc, url = start_http(home.root)
        (home.root / "config.toml").write_text(
            f'[tools.shell]\nread_paths = ["{REPO / "tests"}"]\n'
            f'[mcp.s]\ncommand = "{sys.executable}"\nargs = ["{SERVER}", "stdio"]\napproval = "auto"\n'
            f'[mcp.h]\nurl = "{url}"\napproval = "auto"\n')
        home = make_home(root=home.root, keep_config=True)
        ctx = make_ctx(home)
        ctx.mcp = ("s", "h")
        times, wrong = asyncio.run(measure(ctx, url, args.runs))
    finally:
        if http_proc is not None:
            http_proc.kill()
            http_proc.wait(10)
        remove_home(home)

    print(f"stdio confined by: {', '.join(found.layers()) or 'nothing (' + found.off_reason() + ')'}")
    print(f"{args.runs} calls of each, interleaved; {wrong} wrong answers")
    figures: dict[str, object] = {"runs": args.runs, "wrong_answers": wrong}
    checks = []
    for transport, kinds in times.items():
        r50, d50 = statistics.median(kinds["runner"]), statistics.median(kinds["direct"])
        r95, d95 = percentile(kinds["runner"], 95), percentile(kinds["direct"], 95)
        added = r50 - d50
        print(f"{transport:5s} runner p50 {r50:6.2f} ms p95 {r95:6.2f} | direct SDK p50 {d50:6.2f} ms p95 {d95:6.2f}"
              f" | added p50 {added:5.2f} ms")
        figures.update({f"{transport}_runner_p50_ms": round(r50, 3), f"{transport}_runner_p95_ms": round(r95, 3),
                        f"{transport}_direct_p50_ms": round(d50, 3), f"{transport}_direct_p95_ms": round(d95, 3),
                        f"{transport}_added_p50_ms": round(added, 3)})
        checks.append(targets.below(f"{transport}_added_p50_ms", added, TARGET_ADDED_P50_MS, " ms",
                                    label=f"{transport} added p50 < {TARGET_ADDED_P50_MS:g} ms"))
    met = targets.judge(*checks)
    return targets.last_line(figures, met, checks_ok=wrong == 0)


if __name__ == "__main__":
    sys.exit(main())
