"""The control service: `/health` and `/livez` for monitors, and the token-guarded control API on loopback.

`/health` and `/livez` need no token (a monitor must reach them), and without it `/health` says only
the status and each check's status; with the token, the whole report. Everything under `/api/` needs
`Authorization: Bearer <data/.control-token>`, compared in constant time; without it: 401, no more.
`/mcp` is Starling's read-only MCP server over Streamable HTTP (mcp_http.py), behind the same token.
A change of health into degraded or down is an alert: a warning log line, and a message to
`[health] alert_to` when it is set.
"""

from __future__ import annotations

import asyncio
import hmac
import sys
import time

from aiohttp import web

from common import db, health, holding
from common.db import read_tx
from common.errors import StarlingError
from common.header_deadline import HEADER_TIMEOUT_S, HeaderDeadline
from common.home import ensure_token_file
from common.runtime import Runtime
from common.service import Service, boot
from common.stores import beat_store
from common.supervisor import Supervisor
from schema import messages as m
from services.control.mcp_http import McpEndpoint

ALERT_TIMEOUT_S = 120.0
MIN_TOKEN_BYTES = 16


class Control:
    def __init__(self, svc: Service, rt: Runtime) -> None:
        self.svc = svc
        self.rt = rt
        self.log = svc.log
        self.token = ensure_token_file(svc.paths.control_token_file).strip()
        self.reader = None
        self.last_status = "ok"
        self.started = time.time()
        # after a crash or a reboot, old beats look stale until every service has reported once:
        # no alert in that first window
        self.grace_s = health.STALE_AFTER_BEATS * svc.cfg.health.heartbeat_interval_ms / 1000
        self.supervisor = Supervisor(svc.paths)
        self.mcp = McpEndpoint(svc.paths, svc.cfg, svc.log)  # /mcp: the read-only MCP server
        self.alerts: set[asyncio.Task] = set()
        self.dashboard = None  # the dashboard at / (services/control/dashboard/), unless [control] dashboard = false

    # ------------------------------------------------------------ health

    def _beats(self) -> list[beat_store.Beat] | None:
        try:
            if self.reader is None:
                self.reader = db.open_reader(self.svc.paths.db_file)
            with read_tx(self.reader):
                return beat_store.all_beats(self.reader)
        except Exception as exc:  # any read failure is reported as "database down", never a crash
            self.log.warning("health_read_failed", error=str(exc))
            self.reader = None
            return None

    async def report(self) -> dict:
        report = health.evaluate(self.svc.paths, self.svc.cfg, self._beats())
        await self._observe(report)
        return report

    async def _observe(self, report: dict) -> None:
        status, before = report["status"], self.last_status
        if status == before or (status != "ok" and time.time() - self.started < self.grace_s):
            return
        self.last_status = status
        lines = health.problems(report)
        if status == "ok":
            self.log.info("health_recovered", previous=before)
            text = f"Starling recovered: health is ok again (was {before})."
        else:
            self.log.warning("health_degraded", status=status, previous=before, problems=lines)
            text = f"Starling health is {status}: " + "; ".join(lines)
        await self._alert(text)

    async def _alert(self, text: str) -> None:
        target = self.svc.cfg.health.alert_to
        if not target:
            return
        task = asyncio.create_task(self._queue_alert(target, text))  # beside /health, which must not wait
        self.alerts.add(task)
        task.add_done_callback(self.alerts.discard)

    async def _queue_alert(self, target: str, text: str) -> None:
        """Queued as an alert: the writer takes it even while the data disk is full (its reserve); sent
        again while the writer's condition lasts, up to ALERT_TIMEOUT_S."""
        instance, _, chat = target.partition(":")
        op = m.EnqueueOutbox(instance=instance, chat=chat, replies=[m.Reply(text=text)], alert=True)
        try:
            await asyncio.wait_for(holding.call(self.rt.client, op, log=self.log), ALERT_TIMEOUT_S)
        except (asyncio.TimeoutError, StarlingError) as exc:
            self.log.error("alert_not_queued", alert_to=target, error=str(exc) or type(exc).__name__)

    async def watch(self) -> None:
        interval = self.svc.cfg.health.heartbeat_interval_ms / 1000
        while True:
            await self.report()
            await asyncio.sleep(interval)

    # ------------------------------------------------------------ http

    def authorised(self, request: web.Request) -> bool:
        given = request.headers.get("Authorization", "")
        scheme, _, token = given.partition(" ")
        # an empty or truncated token file must not open the API to anyone
        return len(self.token) >= MIN_TOKEN_BYTES and scheme == "Bearer" and hmac.compare_digest(token.encode(), self.token)

    @web.middleware
    async def guard(self, request: web.Request, handler):
        guarded = request.path.startswith("/api/") or request.path == "/mcp" or request.path.startswith("/mcp/")
        if guarded and not self.authorised(request):
            return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    async def livez(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def health_endpoint(self, request: web.Request) -> web.Response:
        report = await self.report()
        shown = report if self.authorised(request) else health.public(report)
        return web.json_response(shown, status=503 if report["status"] == "down" else 200)

    async def processes(self) -> list[dict]:
        """supervisord's view of the processes; [] without a supervisord (systemd, a test)."""
        try:
            return [p.__dict__ for p in await asyncio.to_thread(self.supervisor.processes)]
        except StarlingError:
            return []

    async def api_status(self, _request: web.Request) -> web.Response:
        beats = self._beats() or []
        try:
            processes = [p.__dict__ for p in await asyncio.to_thread(self.supervisor.processes)]
        except StarlingError:
            processes = []
        return web.json_response({
            "now": time.time(),
            "beats": [b._asdict() for b in beats],
            "processes": processes,
        })

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard])
        app.router.add_get("/livez", self.livez)
        app.router.add_get("/health", self.health_endpoint)
        app.router.add_get("/api/status", self.api_status)
        if self.svc.cfg.control.dashboard:
            from services.control.dashboard import Deps, install

            self.dashboard = install(app, Deps(self.svc.paths, lambda: self.svc.cfg, self.log, self.rt.client,
                                               self.report, self.processes))
        app.router.add_route("*", "/mcp", self.mcp.handle)
        return app


async def serve(rt: Runtime) -> None:
    svc = rt.svc
    await asyncio.to_thread(db.wait_for_schema, svc.paths.db_file, 60.0, stop=svc.stopping)
    control = Control(svc, rt)
    host, _, port = svc.cfg.control.listen.rpartition(":")
    # the same header deadline as the webhook servers: with allow_remote the API is reachable from afar
    runner = web.AppRunner(control.app(), access_log=None, keepalive_timeout=HEADER_TIMEOUT_S)
    await runner.setup()
    factory = runner.server
    server = await asyncio.get_running_loop().create_server(
        lambda: HeaderDeadline(factory(), HEADER_TIMEOUT_S, lambda: svc.log.info("slow_headers_cut")),
        host.strip("[]"), int(port), reuse_address=True)
    svc.log.info("listening", listen=svc.cfg.control.listen)
    await rt.announce_ready()
    try:
        await control.watch()
    finally:
        server.close()
        if control.dashboard is not None:
            await control.dashboard.close()  # its log streams end now, not at aiohttp's shutdown timeout
        await runner.cleanup()
        await control.mcp.close()


def main(argv: list[str] | None = None) -> int:
    svc = boot("control", argv, description="Starling's health endpoint and control API")
    return asyncio.run(Runtime(svc).run(serve, announces_ready=True))


if __name__ == "__main__":
    sys.exit(main())
