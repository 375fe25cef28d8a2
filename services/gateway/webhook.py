"""The HTTP servers gateways listen on for platform webhooks: one aiohttp server per listen address,
shared by every instance configured on it, and the limits that keep a stranger from wearing it down.

- Headers: a connection whose request headers are not complete within HEADER_TIMEOUT_S is cut
  (HeaderDeadline for a connection's first request; aiohttp's keep-alive timer, set to the same,
  for the idle time before each later one), so a slowloris holds a socket for seconds, not forever.
- Bodies: ``read_body`` refuses a declared length over MAX_BODY before reading (413), gives a body
  BODY_TIMEOUT_S to arrive (408), and lets at most MAX_UNVERIFIED bodies be read at once before
  their signature is checked: one more is answered 503 at once and its connection closed, so
  unsigned floods cannot grow the process (60 concurrent 4 MB posts took one from 55 to 346 MB).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable

from common.errors import BusTimeout, StarlingError, WriteRejected
from common.header_deadline import HEADER_TIMEOUT_S, HeaderDeadline

MAX_BODY = 4 * 1024 * 1024  # platform events are small; a larger body is refused before it is read
MAX_UNVERIFIED = 4  # bodies read at once before their signature is checked, per process
BODY_TIMEOUT_S = 10.0  # a body that has not arrived by then is not a platform's
Handler = Callable[["web.Request"], Awaitable["web.StreamResponse"]]

# aiohttp.web is imported where a server starts or answers (~2 MB of RSS): a gateway that only polls never loads it.
if TYPE_CHECKING:
    from aiohttp import web


def _refusal(cls: type[web.HTTPException], **kw) -> web.HTTPException:
    """An HTTP error that also closes the connection (the rest of its body is not worth draining)."""
    exc = cls(**kw)
    exc.force_close()
    return exc


class WebhookServers:
    def __init__(self, log, *, header_timeout_s: float = HEADER_TIMEOUT_S, max_unverified: int = MAX_UNVERIFIED,
                 body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        self.log = log
        self.header_timeout_s = header_timeout_s
        self.max_unverified = max_unverified
        self.body_timeout_s = body_timeout_s
        self.reading = 0  # unverified bodies being read now
        self.refused: dict[str, int] = {"slow_headers": 0, "busy": 0, "too_large": 0, "slow_body": 0}
        self._routes: dict[str, dict[tuple[str, str], tuple[Handler, str]]] = {}
        self._runners: list[web.AppRunner] = []
        self._servers: list[asyncio.base_events.Server] = []

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
        if not self._routes:
            return
        from aiohttp import web

        loop = asyncio.get_running_loop()
        for listen, routes in self._routes.items():
            app = web.Application(client_max_size=MAX_BODY)
            for (method, path), (handler, _owner) in routes.items():
                app.router.add_route(method, path, handler)
            # keepalive_timeout bounds the wait for each later request's headers on a kept connection
            runner = web.AppRunner(app, access_log=None, handle_signals=False,
                                   keepalive_timeout=self.header_timeout_s)
            await runner.setup()
            host, _, port = listen.rpartition(":")
            factory = runner.server
            try:
                server = await loop.create_server(
                    lambda: HeaderDeadline(factory(), self.header_timeout_s, self._count_slow_headers),
                    host.strip("[]"), int(port), reuse_address=True)
            except OSError as exc:
                await runner.cleanup()
                raise StarlingError(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
            self._runners.append(runner)
            self._servers.append(server)
            self.log.info("webhook_listening", listen=listen, paths=sorted({p for _m, p in routes}))

    def _count_slow_headers(self) -> None:
        self._refuse("slow_headers")

    def _refuse(self, reason: str, **detail: object) -> None:
        self.refused[reason] += 1
        count = self.refused[reason]
        if count <= 10 or count % 100 == 0:
            self.log.warning("webhook_cut", reason=reason, count=count, **detail)

    async def read_body(self, request: web.Request, *, verified: bool = False) -> bytes:
        """The request's body, within the limits above. ``verified``: the request already proved it is
        the platform's (Telegram's secret header), so it does not take an unverified slot. Raises the
        HTTP error to answer (413, 503, 408), which aiohttp sends as the response."""
        from aiohttp import web

        declared = request.content_length
        if declared is not None and declared > MAX_BODY:
            self._refuse("too_large", size=declared, peer=request.remote)
            raise _refusal(web.HTTPRequestEntityTooLarge, max_size=MAX_BODY, actual_size=declared)
        if not verified and self.reading >= self.max_unverified:
            self._refuse("busy", peer=request.remote)
            raise _refusal(web.HTTPServiceUnavailable, headers={"Retry-After": "1"})
        slot = 0 if verified else 1
        self.reading += slot
        try:
            return await asyncio.wait_for(request.read(), self.body_timeout_s)
        except asyncio.TimeoutError:
            self._refuse("slow_body", peer=request.remote)
            raise _refusal(web.HTTPRequestTimeout) from None
        finally:
            self.reading -= slot

    async def close(self) -> None:
        for server in self._servers:  # no new connections; the runners then close the open ones
            server.close()
        for runner in self._runners:
            await runner.cleanup()
        self._servers = []
        self._runners = []


async def answer_after_ack(work: Awaitable, within_s: float, log) -> web.Response:
    """The answer to a platform's webhook request: 200 once ``work`` (handing its messages to the writer)
    is done; 503 when the writer has not acked within ``within_s`` (the platform retries, and the writer
    dedupes what did land); 500 with a log line, not a traceback, on a bug."""
    from aiohttp import web

    try:
        await asyncio.wait_for(work, within_s)
    except (BusTimeout, WriteRejected, asyncio.TimeoutError) as exc:
        log.warning("inbound_not_acked", error=str(exc) or type(exc).__name__)
        return web.Response(status=503)
    except Exception as exc:
        log.error("webhook_failed", error=repr(exc))
        return web.Response(status=500)
    return web.Response(status=200)
