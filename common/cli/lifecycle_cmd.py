"""`starling restart [SERVICE…]`, `start SERVICE…`, `stop SERVICE…`, `reload`: one home's services while
supervisord keeps running. SERVICE is a name `starling status` shows (runner-1, gateway-telegram-main)
or a kind (runner, gateway: all of them). `reload` re-reads config.toml: what can change in place does
(SIGHUP; common/reload_plan.py says which keys), services that read the rest are restarted, programs
added or removed (runners, gateway processes), and the command says which."""

from __future__ import annotations

import argparse
import time

from common import reload_plan
from common.cli import applied, output
from common.cli.context import NOT_RUNNING, Context
from common.cli.service_cmd import preflight, wait_ready, why_not_ready
from common.errors import StarlingError
from common.programs import expected_services
from common.supervisor import Supervisor

READY_TIMEOUT_S = 30.0


def register(verbs) -> None:
    restart = verbs.add_parser("restart", help="restart services (all when none is named) and wait until ready",
                               description="SERVICE is a name `starling status` shows, or runner or gateway for"
                                           " all of that kind. With none, every service restarts (supervisord"
                                           " stays) and config.toml's programs are applied, as by reload.")
    restart.add_argument("services", nargs="*", metavar="SERVICE")
    restart.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for readiness")
    restart.set_defaults(func=cmd_restart)
    start = verbs.add_parser("start", help="start stopped services and wait until ready")
    start.add_argument("services", nargs="+", metavar="SERVICE")
    start.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for readiness")
    start.set_defaults(func=cmd_start)
    stop = verbs.add_parser("stop", help="stop services until `starling start` (status then exits 3)")
    stop.add_argument("services", nargs="+", metavar="SERVICE")
    stop.set_defaults(func=cmd_stop)
    reload = verbs.add_parser("reload", help="apply a changed config.toml: in place where possible, else restart",
                              description=__doc__.split("\n\n")[0])
    reload.add_argument("--timeout", type=float, default=READY_TIMEOUT_S, help="seconds to wait for readiness")
    reload.set_defaults(func=cmd_reload)


def _running(ctx: Context) -> Supervisor:
    running = ctx.running_paths()
    if running.data_dir != ctx.paths.data_dir:
        raise StarlingError(f"data_dir changed: the services run with {running.data_dir}, config.toml now names"
                            f" {ctx.paths.data_dir}; supervisord's socket and logs live there, so no reload can move"
                            " them: run `starling down` (it finds the running ones), then `starling up`."
                            " Nothing changed.")
    sup = Supervisor(ctx.paths)
    if not sup.reachable():
        raise StarlingError(f"{NOT_RUNNING} for {ctx.home}")
    return sup


def resolve(names: list[str], known: list[str]) -> list[str]:
    """Service names as given, kinds expanded (runner: runner-0, runner-1, …); an unknown one is an error."""
    found: list[str] = []
    for name in names:
        if name in known:
            matches = [name]
        else:
            matches = [k for k in known if k.startswith(f"{name}-")]
        if not matches:
            raise UsageError(f"no service named {name!r}; services: {', '.join(known)}")
        found += [m for m in matches if m not in found]
    return found


class UsageError(StarlingError):
    """A service name that is not one of this home's."""


def _known(ctx: Context, sup: Supervisor) -> list[str]:
    return list(dict.fromkeys([*expected_services(ctx.cfg), *(p.name for p in sup.processes())]))


LIVE = ("RUNNING", "STARTING", "BACKOFF", "STOPPING")
STOP_TIMEOUT_S = 60.0


def _stop(sup: Supervisor, names: list[str]) -> None:
    """Stop them all at once, the writer last (the others' last heartbeat goes to it), and wait."""
    live = {p.name for p in sup.processes() if p.state in LIVE}
    others = [n for n in names if n != "writer" and n in live]
    for name in others:
        sup.stop_process(name, wait=False)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while others and time.monotonic() < deadline:
        states = {p.name: p.state for p in sup.processes()}
        others = [n for n in others if states.get(n) in LIVE]
        time.sleep(0.05)
    if others:
        raise StarlingError(f"still not stopped after {STOP_TIMEOUT_S:.0f}s: {', '.join(others)}")
    if "writer" in names and "writer" in live:
        sup.stop_process("writer")


def _restart(sup: Supervisor, names: list[str]) -> None:
    ordered = reload_plan.order(names)
    _stop(sup, ordered)
    for name in ordered:
        sup.start_process(name, wait=False)


def _await(ctx: Context, sup: Supervisor, names: list[str], since: float, timeout: float) -> int:
    if not names:
        return 0
    ready, waiting = wait_ready(ctx, sup, names, since, timeout)
    if waiting:
        output.error(f"not ready after {timeout:.0f}s: {', '.join(waiting)}")
        for name in waiting:
            print(f"  {name}: {why_not_ready(ctx, sup, name)}")
        return 1
    print(f"ready: {', '.join(ready)}")
    return 0


def _guarded(verb):
    def run(args: argparse.Namespace) -> int:
        try:
            return verb(args)
        except UsageError as exc:
            output.error(str(exc))
            return 2
    return run


@_guarded
def cmd_restart(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    sup = _running(ctx)
    since = time.time()
    if args.services:
        names = resolve(args.services, _known(ctx, sup))
        _restart(sup, names)
        print(f"restarted: {', '.join(names)}")
        return _await(ctx, sup, names, since, args.timeout)
    preflight(ctx)
    added, changed, removed = sup.update(ctx.paths, ctx.cfg)
    for name in removed:
        print(f"removed: {name}")
    names = [n for n in expected_services(ctx.cfg) if n not in added and n not in changed]
    _restart(sup, names)
    applied.save(ctx)
    print(f"restarted: {', '.join([*names, *changed])}" + (f"; added: {', '.join(added)}" if added else ""))
    return _await(ctx, sup, expected_services(ctx.cfg), since, args.timeout)


@_guarded
def cmd_start(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    sup = _running(ctx)
    names = resolve(args.services, _known(ctx, sup))
    states = {p.name: p.state for p in sup.processes()}
    since = time.time()
    started = []
    for name in reload_plan.order(names):
        if states.get(name) in ("RUNNING", "STARTING"):
            print(f"{name}: already running")
            continue
        sup.start_process(name, wait=False)
        started.append(name)
    if started:
        print(f"started: {', '.join(started)}")
    return _await(ctx, sup, started, since, args.timeout)


@_guarded
def cmd_stop(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    sup = _running(ctx)
    names = resolve(args.services, _known(ctx, sup))
    states = {p.name: p.state for p in sup.processes()}
    live = [n for n in reload_plan.order(names) if states.get(n) in LIVE]
    for name in names:
        if name not in live:
            print(f"{name}: not running ({states.get(name, 'unknown')})")
    _stop(sup, live)
    if live:
        print(f"stopped: {', '.join(live)}")
    return 0


def cmd_reload(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    sup = _running(ctx)
    preflight(ctx)  # the new config loads, or nothing changes
    old = applied.load(ctx)
    if old is None:
        output.warn("no copy of the config the services run with (data/run/config.applied.toml): restarting all")
        return cmd_restart(argparse.Namespace(**{**vars(args), "services": []}))
    plan = reload_plan.plan(old, ctx.cfg)
    if plan.needs_down:
        raise StarlingError(f"{', '.join(plan.needs_down)} changed: supervisord's socket and logs live there, so no"
                            " reload can move them; put the old value back, run `starling down`, change it again"
                            " and run `starling up`. Nothing changed.")
    since = time.time()
    added, changed, removed = sup.update(ctx.paths, ctx.cfg)
    replaced = set(added) | set(changed)
    restart = reload_plan.order(plan.restart - replaced)
    in_place = reload_plan.order(plan.in_place - replaced)
    _restart(sup, restart)
    for name in in_place:
        sup.signal_process(name, "HUP")
    applied.save(ctx)
    if not plan.changed:
        print("config.toml is what the services run with: nothing to do.")
        return 0
    shown = ", ".join(plan.changed[:8]) + (f" and {len(plan.changed) - 8} more" if len(plan.changed) > 8 else "")
    print(f"config.toml reloaded ({shown}):")
    rows = [("in place (SIGHUP)", in_place), ("restarted", [*restart, *changed]), ("added", added),
            ("removed", removed)]
    for label, names in rows:
        if names:
            print(f"  {label}: {', '.join(names)}")
    if not any(names for _, names in rows):
        print("  no running service reads these keys; nothing restarted")
    return _await(ctx, sup, [*restart, *added, *changed], since, args.timeout)
