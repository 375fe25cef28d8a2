"""The HTTP servers gateways listen on for platform webhooks: one aiohttp server per listen address,
shared by every instance configured on it, with a cap on request bodies."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from aiohttp import web

from common.errors import BusTimeout, StarlingError, WriteRejected

MAX_BODY = 4 * 1024 * 1024  # platform events are small; a larger body is refused before it is read
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class WebhookServers:
    def __init__(self, log) -> None:
        self.log = log
        self._routes: dict[str, dict[tuple[str, str], tuple[Handler, str]]] = {}
        self._runners: list[web.AppRunner] = []

    def route(self, listen: str, method: str, path: str, handler: Handler, owner: str) -> None:
        """Serve ``method path`` on ``listen``; ``owner`` names the config entry, for the clash error."""
        routes = self._routes.setdefault(listen, {})
        if (method, path) in routes:
            other = routes[(method, path)][1]
            raise StarlingError(f"{owner} and {other} both listen on {listen} at {path}: give one another"
                                " listen address or public_url path")
        routes[(method, path)] = (handler, owner)

    @property
    def addresses(self) -> list[str]:
        return list(self._routes)

    async def start(self) -> None:
        for listen, routes in self._routes.items():
            app = web.Application(client_max_size=MAX_BODY)
            for (method, path), (handler, _owner) in routes.items():
                app.router.add_route(method, path, handler)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            host, _, port = listen.rpartition(":")
            try:
                await web.TCPSite(runner, host.strip("[]"), int(port), reuse_address=True).start()
            except OSError as exc:
                await runner.cleanup()
                raise StarlingError(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
            self._runners.append(runner)
            self.log.info("webhook_listening", listen=listen, paths=sorted({p for _m, p in routes}))

    async def close(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []


async def answer_after_ack(work: Awaitable, within_s: float, log) -> web.Response:
    """The answer to a platform's webhook request: 200 once ``work`` (handing its messages to the writer)
    is done; 503 when the writer has not acked within ``within_s`` (the platform retries, and the writer
    dedupes what did land); 500 with a log line, not a traceback, on a bug."""
    try:
        await asyncio.wait_for(work, within_s)
    except (BusTimeout, WriteRejected, asyncio.TimeoutError) as exc:
        log.warning("inbound_not_acked", error=str(exc) or type(exc).__name__)
        return web.Response(status=503)
    except Exception as exc:
        log.error("webhook_failed", error=repr(exc))
        return web.Response(status=500)
    return web.Response(status=200)
