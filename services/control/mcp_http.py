"""`/mcp` on the control service: Starling's read-only MCP server (common/mcp_server.py) over Streamable HTTP.

The control service checks the token before a request gets here (main.py's guard: 401 without it). The
SDK's transport is an ASGI app; this module hands it one aiohttp request at a time as an ASGI call and
streams its answer back, so `/mcp` shares the control service's port, token and limits. It runs
stateless (each POST stands alone, no session to keep) with JSON answers. The SDK's DNS-rebinding check
is off: a browser cannot send the bearer token that every request here needs, and behind the operator's
proxy the Host header is a name the SDK cannot know. The SDK is imported at the first authorised
request, not when the control service starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from common.config import Config
from common.home import Paths

MAX_BODY = 4 * 1024 * 1024  # one MCP request; larger is refused (413) before it is read


class McpEndpoint:
    def __init__(self, paths: Paths, cfg: Config, log) -> None:
        self.paths = paths
        self.cfg = cfg
        self.log = log
        self._app: Any = None
        self._starting: asyncio.Lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def _asgi(self):
        """The SDK's app, its session manager running in a task of its own until ``close``."""
        async with self._starting:
            if self._app is not None:
                return self._app
            from mcp.server.transport_security import TransportSecuritySettings

            from common.mcp_server import build

            server = build(self.paths, self.cfg)
            app = server.streamable_http_app(
                stateless_http=True, json_response=True, max_request_body_size=MAX_BODY,
                transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
            ready = asyncio.get_running_loop().create_future()

            async def run_manager() -> None:
                try:
                    async with server.session_manager.run():
                        ready.set_result(None)
                        await self._stop.wait()
                except Exception as exc:  # noqa: BLE001 - reported to the first request, logged
                    if not ready.done():
                        ready.set_exception(exc)
                    self.log.error("mcp_manager_failed", error=str(exc))

            self._task = asyncio.create_task(run_manager(), name="mcp-http")
            await ready
            self._app = app
            self.log.info("mcp_serving", path="/mcp")
            return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.content_length is not None and request.content_length > MAX_BODY:
            return web.json_response({"error": "request too large"}, status=413)
        app = await self._asgi()
        body = await request.read()
        done = asyncio.Event()
        response: web.StreamResponse | None = None

        async def receive() -> dict:
            nonlocal body
            if body is not None:
                chunk, body = body, None
                return {"type": "http.request", "body": chunk, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            nonlocal response
            if message["type"] == "http.response.start":
                response = web.StreamResponse(status=message["status"])
                for key, value in message.get("headers", []):
                    response.headers.add(key.decode("latin-1"), value.decode("latin-1"))
                await response.prepare(request)
            elif message["type"] == "http.response.body" and response is not None:
                if message.get("body"):
                    await response.write(message["body"])
                if not message.get("more_body", False):
                    await response.write_eof()

        try:
            await app(_scope(request), receive, send)
        finally:
            done.set()
        return response if response is not None else web.Response(status=500)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(self._task, 5)


def _scope(request: web.Request) -> dict:
    peer = request.transport.get_extra_info("peername") if request.transport else None
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": request.method, "scheme": request.scheme, "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1"),
        "query_string": request.query_string.encode("latin-1"), "root_path": "",
        "headers": [(k.lower(), v) for k, v in request.raw_headers],
        "client": tuple(peer[:2]) if peer else None, "server": tuple(sock[:2]) if sock else None,
    }
