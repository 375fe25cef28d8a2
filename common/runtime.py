"""The life of an asyncio service: heartbeats on the bus, systemd readiness and watchdog, a clean stop.

A heartbeat the writer cannot take (its disk full, it restarting) is never fatal: later beats go on,
and the first one, which readiness waits for, is sent again until it is stored (common/holding.py).

Before any work the process enlists under its name (``Enlist``, common/identity.py): a live process of
that name refuses it (it exits 1, naming the first one's pid and since when); a gone predecessor's turns
and outbox rows come back at once. A process whose name was taken over (it was judged gone) hears so on
its next beat and stops.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Awaitable, Callable

from common import bus, daemon_log, holding, identity, lean
from common.config import Config, load_config
from common.errors import StarlingError, WriteRejected
from common.health import STALE_AFTER_BEATS
from common.reload_plan import changed_keys
from common.service import Service, notify_systemd, watchdog_interval_s
from schema import messages as m

Work = Callable[["Runtime"], Awaitable[None]]
PARENT_CHECK_S = 1.0


class Twin(StarlingError):
    """A live process already runs under this name: this one refuses to start."""


class Runtime:
    """Runs one service's work beside its heartbeat until SIGTERM, then stops within the stop timeout.

    The first heartbeat is acked by the writer before the service counts as ready (`starling up`
    waits for it); later beats go every ``health.heartbeat_interval_ms`` and ping systemd's watchdog.
    """

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.log = svc.log
        self.stop_event = asyncio.Event()
        self.state = "starting"
        self.detail = ""
        self.describe: Callable[[], str] | None = None  # a live detail for every beat (a gateway's connections)
        self.identity = identity.this_process(svc.name)  # identity.worker owns every lease this process takes
        self.enlisted: m.Enlisted | None = None
        self._enlisted = asyncio.Event()
        self.reload_hooks: list[Callable[[Config], None]] = []  # called with the new config on SIGHUP
        self.client = bus.WriterClient(
            svc.endpoints.writer, svc.key, name=svc.name, timeout_s=svc.cfg.bus.request_timeout_ms / 1000,
            window=svc.cfg.bus.window, heartbeat_ms=svc.cfg.bus.heartbeat_ivl_ms, deadline_s=3600,
        )

    async def beat(self, state: str | None = None, detail: str | None = None, hold: bool = False) -> None:
        """Report in. The writer's condition is logged, not raised (the next beat tries again), or with
        ``hold`` waited out; other errors are raised."""
        if state is not None:
            self.state = state
        if detail is not None:
            self.detail = detail
        elif self.describe is not None:
            self.detail = self.describe()
        op = m.Heartbeat(service=self.svc.name, pid=os.getpid(), state=self.state, detail=self.detail,
                         parent_pid=os.getppid(), worker=self.identity.worker)
        if hold:
            await holding.call(self.client, op, log=self.log)
            return
        try:
            await self.client.call(op)
        except Exception as exc:
            if not holding.condition(exc):
                raise
            self.log.warning("heartbeat_failed", error=str(exc) or type(exc).__name__)

    async def _heartbeats(self) -> None:
        interval = self.svc.cfg.health.heartbeat_interval_ms / 1000
        watchdog = watchdog_interval_s()
        tick = min(interval, watchdog) if watchdog else interval
        next_beat = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, min(tick, next_beat - time.monotonic())))
            if not self._ready.is_set():
                continue
            if watchdog:
                notify_systemd("WATCHDOG=1")
            if time.monotonic() >= next_beat:
                next_beat = time.monotonic() + interval
                try:
                    await asyncio.wait_for(self.beat(), interval)
                except WriteRejected as exc:
                    if exc.code != "conflict":
                        self.log.warning("heartbeat_failed", error=str(exc))
                        continue
                    self.log.error("superseded", error=str(exc))  # another process runs under our name now
                    self.request_stop("superseded")
                    return
                except (asyncio.TimeoutError, StarlingError) as exc:
                    self.log.warning("heartbeat_failed", error=str(exc))

    async def enlist(self) -> m.Enlisted:
        """Become the process under this name (before any work); raises Twin when a live one is."""
        cfg = self.svc.cfg
        ident = self.identity
        # gone where its pid cannot be looked up: silent longer than a lease and than three heartbeats
        stale = max(cfg.runner.lease_s, cfg.gateways.outbox_lease_s,
                    STALE_AFTER_BEATS * cfg.health.heartbeat_interval_ms / 1000)
        op = m.Enlist(name=ident.name, worker=ident.worker, pid=ident.pid, pid_start=ident.pid_start, host=ident.host,
                      pid_scope=ident.pid_scope, stale_after_s=stale, alert_to=cfg.health.alert_to)
        try:
            enlisted = await holding.call(self.client, op, log=self.log)
        except WriteRejected as exc:
            if exc.code == "conflict":
                raise Twin(str(exc).split(": ", 1)[-1]) from None
            raise
        if enlisted.predecessor:
            self.log.info("took_over", predecessor=enlisted.predecessor, turns=enlisted.turns, outbox=enlisted.outbox)
        self.enlisted = enlisted
        self._enlisted.set()
        return enlisted

    async def _enlist_then(self, work: Work | None) -> None:
        await self.enlist()
        if work is not None:
            await work(self)
        else:
            await asyncio.Event().wait()

    async def announce_ready(self, state: str = "ready", detail: str = "") -> None:
        """The service can do its work: tell the writer (which `starling up` watches) and systemd."""
        await self._enlisted.wait()
        await self.beat(state, detail, hold=True)
        notify_systemd("READY=1")
        self.log.info("ready", state=state, detail=detail)
        self._ready.set()
        lean.release_free_heap()

    async def run(self, work: Work | None, state: str = "ready", detail: str = "",
                  announces_ready: bool = False) -> int:
        """Run ``work`` until it ends or SIGTERM. Readiness is announced at once, unless the work
        ``announces_ready`` itself once it really can serve (a bound port, a loaded config)."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        loop.add_signal_handler(signal.SIGHUP, self.reload_config)
        if self.svc.hangup.is_set():  # SIGHUP came while the service was starting
            loop.call_soon(self.reload_config)
        self._ready = asyncio.Event()
        if self.svc.stopping.is_set():  # SIGTERM came before the handlers above were in place
            self.stop_event.set()
        self.client.start()
        try:
            tasks = [asyncio.create_task(self._heartbeats()), asyncio.create_task(self._watch_parent())]
            tasks.append(asyncio.create_task(daemon_log.ship(  # warnings and errors into the daemon_log table
                self.client, self.svc.name, lambda: self.svc.cfg.retention.audit_days, self.log)))
            if not announces_ready:  # raced with the stop below: a writer that never answers must not block it
                tasks.append(asyncio.create_task(self._announce_then_idle(state, detail)))
            tasks.append(asyncio.create_task(self._enlist_then(work)))
            stopper = asyncio.create_task(self.stop_event.wait())
            done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
            failed = [t for t in done if t is not stopper and not t.cancelled() and t.exception()]
            for task in [*tasks, stopper]:
                task.cancel()
            await asyncio.gather(*tasks, stopper, return_exceptions=True)
            if failed and not self.stop_event.is_set():
                error = failed[0].exception()
                if isinstance(error, Twin):
                    self.log.error("twin_refused", error=str(error), pid=os.getpid())
                    return 1
                self.log.error("failed", error=str(error) or repr(error), kind=type(error).__name__)
                return 1
            notify_systemd("STOPPING=1")
            if self._enlisted.is_set():  # a process that never enlisted has no beat of its own to end
                try:
                    await asyncio.wait_for(self.beat("stopped", ""), 2)
                except (asyncio.TimeoutError, StarlingError):
                    pass
            self.log.info("stopped")
            return 0
        finally:
            await self.client.close()

    async def _announce_then_idle(self, state: str, detail: str) -> None:
        await self.announce_ready(state, detail)
        await asyncio.Event().wait()

    def reload_config(self) -> None:
        """SIGHUP (`starling reload`): read config.toml again. ``svc.cfg`` becomes the new config, so what
        the service reads from it at use changes in place, and the reload hooks apply the rest they can
        (common/reload_plan.py says which keys); a file that does not load keeps the old config."""
        self.svc.hangup.clear()
        try:
            cfg = load_config(self.svc.paths.config_file)
        except StarlingError as exc:
            self.log.error("config_reload_failed", error=str(exc), note="the config loaded at start stays")
            return
        old, self.svc.cfg = self.svc.cfg, cfg
        for hook in self.reload_hooks:
            try:
                hook(cfg)
            except Exception as exc:  # noqa: BLE001 - a hook's failure is logged, the service goes on
                self.log.error("config_reload_failed", error=str(exc) or repr(exc), kind=type(exc).__name__)
        self.log.info("config_reloaded", changed=changed_keys(old, cfg))

    def _on_signal(self, signum: int) -> None:
        self.request_stop(f"signal {signal.Signals(signum).name}")

    def request_stop(self, why: str) -> None:
        # the flags first: logging can fail (stdout gone with a killed supervisord) and must not lose the stop
        self.stop_event.set()
        self.svc.stopping.set()  # threads (e.g. waiting for the schema) watch this one
        try:
            self.log.info("stop_requested", reason=why)
        except OSError:
            pass

    async def _watch_parent(self) -> None:
        """Under supervisord, a service whose supervisord died (kill -9) stops instead of living on as an
        orphan that a new `starling up` would duplicate."""
        if not os.environ.get("SUPERVISOR_ENABLED"):
            await asyncio.Event().wait()  # not under supervisord: nothing to watch (never returns)
        parent = os.getppid()
        while True:
            await asyncio.sleep(PARENT_CHECK_S)
            if os.getppid() != parent:
                self.request_stop("supervisord is gone")
                return

