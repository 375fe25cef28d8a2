"""`starling up|down|status`: the services of one home under supervisord."""

from __future__ import annotations

import os
import signal
import time

from common import db, orphans, pids, ports, registry
from common.cli import held, output
from common.cli import applied
from common.cli.context import Context
from common.errors import StarlingError
from common.home import ensure_layout
from common.pids import alive
from common.stores import beat_store, schema_store
from common.supervisor import Supervisor, expected_services, pid_file

UP_STATES = ("ready", "idle")
LOG_TAIL_LINES = 5


def register(verbs) -> None:
    up = verbs.add_parser("up", help="start every service under supervisord and wait until all are ready")
    up.add_argument("--foreground", action="store_true", help="keep supervisord in the foreground (containers)")
    up.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for readiness (default 30)")
    up.set_defaults(func=cmd_up)
    down = verbs.add_parser("down", help="stop every service; no process is left")
    down.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the stop (default 60)")
    down.set_defaults(func=cmd_down)
    status = verbs.add_parser("status", help="each process: state, pid, uptime, last heartbeat, restarts")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)


def preflight(ctx: Context) -> None:
    """Fail before any process starts: a bad config, or a database newer than this code."""
    cfg = ctx.cfg  # raises ConfigError naming file, key and reason
    ensure_layout(ctx.paths)
    ctx.endpoints  # noqa: B018 - validates the bus addresses
    if ctx.paths.db_file.exists():
        conn = db.open_reader(ctx.paths.db_file)
        try:
            schema_store.check_not_newer(conn, ctx.paths.db_file)
        except db.UNUSABLE_ERRORS as exc:  # not a database at all; damage deeper in is the writer's check
            raise db.unusable(ctx.paths.db_file, exc) from None
        finally:
            conn.close()
    return cfg


def cmd_up(args) -> int:
    ctx = Context.from_args(args)
    preflight(ctx)
    sup = Supervisor(ctx.paths)
    if sup.reachable():
        print(f"Starling is already running for {ctx.home} (supervisord pid {sup.supervisord_pid()}); nothing was started.")
        drift = applied.drift(ctx)
        if drift:
            print(drift)
        return 0
    left = orphans.find(ctx.home)  # a supervisord killed -9 leaves its services running: stop them first
    if left:
        print(f"Stopping {len(left)} service process(es) a previous supervisord left running"
              f" (pids {', '.join(map(str, left))}).")
        orphans.stop(left)
    problems = ports.clashes(ctx.cfg) + ports.busy(ctx.cfg)  # before anything starts
    if problems:
        raise StarlingError("cannot start: " + "; ".join(problems))
    started = time.time()
    applied.save(ctx)
    if args.foreground:
        # supervisord takes this pid over
        registry.record(ctx.home, os.getpid(), ctx.cfg.control.listen, ctx.paths.data_dir)
        sup.start_daemon(ctx.cfg, foreground=True)  # does not return
    sup.start_daemon(ctx.cfg)
    if not sup.wait_reachable(10):
        raise StarlingError(f"supervisord did not come up; see {ctx.paths.logs_dir / 'supervisord.log'}")
    registry.record(ctx.home, sup.supervisord_pid() or 0, ctx.cfg.control.listen, ctx.paths.data_dir)
    expected = expected_services(ctx.cfg)
    ready, waiting = wait_ready(ctx, sup, expected, started, args.timeout)
    elapsed = time.time() - started
    if waiting:
        output.error(f"not ready after {min(elapsed, args.timeout):.0f}s: {', '.join(waiting)}")
        for name in waiting:
            print(f"  {name}: {why_not_ready(ctx, sup, name)}")
        print("Services keep running under supervisord; see `starling status`, `starling logs SERVICE`,"
              " and stop them with `starling down`.")
        return 1
    print(f"Starling is up in {elapsed:.1f}s: {len(ready)} services ready ({', '.join(ready)}).")
    return 0


def wait_ready(ctx: Context, sup: Supervisor, expected: list[str], since: float,
               timeout: float) -> tuple[list[str], list[str]]:
    """Wait until each expected service's current pid has reported ready (or idle) after ``since``."""
    deadline = time.monotonic() + timeout
    reader = None
    while True:
        processes = sup.processes()
        pids = {p.name: p.pid for p in processes}
        states = {p.name: p.state for p in processes}
        beats = {}
        try:
            reader = reader or db.open_reader(ctx.paths.db_file)
            with db.read_tx(reader):
                beats = {b.service: b for b in beat_store.all_beats(reader)}
        except StarlingError:
            reader = None  # no database yet: the writer is still migrating
        except Exception:  # noqa: BLE001 - a schema not yet created reads as "not ready"
            reader = None
        ready = [n for n in expected if _is_ready(beats.get(n), pids.get(n), since)]
        waiting = [n for n in expected if n not in ready]
        given_up = all(states.get(n) == "FATAL" for n in waiting)  # supervisord stopped retrying them
        if not waiting or given_up or _refused_since(ctx, since) or time.monotonic() >= deadline:
            if reader is not None:
                reader.close()
            return ready, waiting
        time.sleep(0.05)


def _is_ready(beat, pid: int | None, since: float) -> bool:
    return bool(beat and pid and beat.pid == pid and beat.state in UP_STATES and beat.beat_at >= since - 1)


def _refused_since(ctx: Context, since: float) -> bool:
    """The writer refused the database during this start: nothing will become ready."""
    try:
        return db.refusal_file(ctx.paths.db_file).stat().st_mtime >= since - 1
    except FileNotFoundError:
        return False


def _refused(ctx: Context, info) -> str | None:
    """Why the writer is down for good: it refused the database, at its last start (not one before the
    start now in progress, which removes the refusal once it opens the file)."""
    refusal = db.refusal_file(ctx.paths.db_file)
    try:
        at = refusal.stat().st_mtime
    except FileNotFoundError:
        return None
    if info is not None and info.pid and info.state in ("RUNNING", "STARTING") and at < info.started - 1:
        return None
    return db.refusal(ctx.paths.db_file)


def why_not_ready(ctx: Context, sup: Supervisor, name: str) -> str:
    info = next((p for p in sup.processes() if p.name == name), None)
    if name == "writer" and (refused := _refused(ctx, info)):
        return f"REFUSED: {refused}"
    state = f"{info.state} ({info.description})" if info else "unknown to supervisord"
    log = ctx.paths.logs_dir / f"{name}.log"
    tail = ""
    if log.exists():
        lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
        tail = "; last log lines:\n    " + "\n    ".join(lines) if lines else "; its log is empty"
    return state + tail


def cmd_down(args) -> int:
    ctx = Context.from_args(args)
    sup = Supervisor(ctx.running_paths())
    if not sup.reachable():
        stuck = _unanswering_supervisord(ctx)
        if stuck is None:
            registry.remove(ctx.home)
            print(f"Starling is not running for {ctx.home}.")
            return 0
        code = _stop_unanswering(stuck, args.timeout)
        registry.remove(ctx.home)
        return code
    daemon_pid = sup.supervisord_pid()
    children = [p.pid for p in sup.processes() if p.pid]
    sup.shutdown()
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in [daemon_pid, *children] if pid):
        time.sleep(0.05)
    left = [pid for pid in [daemon_pid, *children] if pid and alive(pid)]
    registry.remove(ctx.home)
    if left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        output.error(f"processes still alive after {args.timeout:.0f}s were killed: {left}")
        return 1
    print(f"Starling stopped for {ctx.home}; no process left.")
    return 0


def _unanswering_supervisord(ctx: Context) -> int | None:
    """The pid of this home's supervisord when it lives but does not answer (stopped, wedged)."""
    try:
        pid = int(pid_file(ctx.paths).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return None
    return pid if b"supervisord" in cmdline and alive(pid) else None


def _stop_unanswering(pid: int, timeout: float) -> int:
    """SIGTERM (after SIGCONT, in case it was stopped): supervisord stops its children; SIGKILL at the end."""
    output.warn(f"supervisord (pid {pid}) does not answer; stopping it with signals")
    children = pids.children(pid)
    for signum in (signal.SIGCONT, signal.SIGTERM):
        os.kill(pid, signum)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in [pid, *children]):
        time.sleep(0.1)
    left = [p for p in [pid, *children] if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    if left:
        output.error(f"processes still alive after {timeout:.0f}s were killed: {left}")
        return 1
    print("Starling stopped; no process left.")
    return 0


def not_running_code(rows: list[dict], expected: list[str]) -> int:
    """3 (supervisorctl's convention) when a service the config expects is not running, else 0."""
    running = {r["service"] for r in rows if r["state"] in ("RUNNING", "STARTING")}
    return 3 if any(name not in running for name in expected) else 0


def cmd_status(args) -> int:
    ctx = Context.from_args(args)
    sup = Supervisor(ctx.paths)
    running = sup.reachable()
    processes = {p.name: p for p in sup.processes()} if running else {}
    beats = {}
    if ctx.paths.db_file.exists():
        reader = db.open_reader(ctx.paths.db_file)
        try:
            with db.read_tx(reader):
                beats = {b.service: b for b in beat_store.all_beats(reader)}
        except Exception:  # noqa: BLE001 - an unmigrated database has no beats yet
            beats = {}
        finally:
            reader.close()
    now = time.time()
    expected = expected_services(ctx.cfg)
    names = list(dict.fromkeys([*expected, *processes]))
    rows = []
    refused = _refused(ctx, processes.get("writer"))
    for name in names:
        info, beat = processes.get(name), beats.get(name)
        state = info.state if info else ("not running" if not running else "unknown")
        if name.startswith("gateway-") and name not in expected and state in ("STOPPED", "not running"):
            state = "not configured"
        if name == "writer" and refused:
            state = "REFUSED"
        rows.append({
            "service": name,
            "state": state,
            "pid": info.pid if info and info.pid else None,
            "uptime_s": round(now - info.started, 1) if info and info.pid else None,
            "heartbeat": beat.state if beat else None,
            "last_beat_s_ago": round(now - beat.beat_at, 1) if beat else None,
            "restarts": beat.starts - 1 if beat else None,
            "detail": refused if name == "writer" and refused else
            beat.detail if beat else (info.description if info else ""),
        })
    kept = held.read(ctx.paths)  # dead letters, spools, the disk reserve
    code = not_running_code(rows, expected)
    if args.json:
        output.emit_json({"home": str(ctx.home), "supervisord": running, "services": rows, "refused": refused,
                          **kept.as_json()})
        return code
    print(f"Starling home {ctx.home}: supervisord {'running' if running else 'not running'}")
    print(output.table(
        ["SERVICE", "STATE", "PID", "UPTIME", "HEARTBEAT", "LAST BEAT", "RESTARTS", "DETAIL"],
        [[r["service"], r["state"], r["pid"] or "-",
          output.duration(r["uptime_s"]) if r["uptime_s"] is not None else "-",
          r["heartbeat"] or "-",
          output.duration(r["last_beat_s_ago"]) + " ago" if r["last_beat_s_ago"] is not None else "-",
          r["restarts"] if r["restarts"] is not None else "-", r["detail"]] for r in rows],
        colour_column=1,
    ))
    for line in kept.lines():
        print(line)
    return code
