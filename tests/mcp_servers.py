"""MCP servers for tests, written with the official SDK (MCPServer): one set of tools over stdio or Streamable HTTP.

``python -m tests.mcp_servers stdio`` serves on stdin/stdout (the runner starts it confined);
``python -m tests.mcp_servers http --port-file PATH`` listens on 127.0.0.1 (a free port, or ``--port N``,
written to PATH once it listens) with the endpoint at /mcp, and with ``--header NAME=VALUE`` refuses
requests without that header (401), as a server behind a token does.

Tools: ``echo`` (read-only hint), ``add``, ``slow`` (sleeps), ``crash`` (the process exits at once),
``read_file`` (what the server can read: the confinement test), ``big`` (a large result), ``env`` (one
variable of the server's environment), ``fail`` (a tool error), ``connect`` (a TCP connection, for the
network test), ``note`` (writes, no hints) and ``pid`` (its process id).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

READ_ONLY = ToolAnnotations(readOnlyHint=True)


def build() -> MCPServer:
    server = MCPServer("starling-test", log_level="WARNING")

    @server.tool(description="Say the text back.", annotations=READ_ONLY)
    def echo(text: str) -> str:
        return f"echo: {text}"

    @server.tool(description="Add two integers.", annotations=READ_ONLY)
    def add(a: int, b: int) -> str:
        return str(a + b)

    @server.tool(description="Sleep, then answer.")
    async def slow(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds}"

    @server.tool(description="Exit the server process at once.")
    def crash() -> str:
        os._exit(3)

    @server.tool(description="Read a file.", annotations=READ_ONLY)
    def read_file(path: str) -> str:
        try:
            return Path(path).read_text()
        except OSError as exc:
            return f"cannot read: {type(exc).__name__}: {exc.strerror}"

    @server.tool(description="A large result.", annotations=READ_ONLY)
    def big(size: int) -> str:
        return "".join(f"line {i:06d}\n" for i in range(size // 12 + 1))[:size]

    @server.tool(description="One variable of the server's environment.", annotations=READ_ONLY)
    def env(name: str) -> str:
        return os.environ.get(name, "<unset>")

    @server.tool(description="Fail.")
    def fail(message: str) -> str:
        raise ValueError(message)

    @server.tool(description="Open a TCP connection to 127.0.0.1:port.")
    def connect(port: int) -> str:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return "connected"
        except OSError as exc:
            return f"refused: {type(exc).__name__}: {exc.strerror}"

    @server.tool(description="The server's process id.", annotations=READ_ONLY)
    def pid() -> str:
        return str(os.getpid())

    @server.tool(description="Write a note (a tool with no hints).")
    def note(text: str) -> str:
        return f"noted {len(text)} characters"

    return server


def serve_http(server: MCPServer, port_file: Path, header: str, port: int = 0) -> None:
    import uvicorn
    from starlette.responses import JSONResponse

    app = server.streamable_http_app(stateless_http=True, json_response=True)
    name, _, value = header.partition("=")

    async def guarded(scope, receive, send):
        if name and scope["type"] == "http":
            headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            if headers.get(name.lower()) != value:
                await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
                return
        await app(scope, receive, send)

    sock = socket.socket()
    # accepted connections inherit it: without, every answer waits ~40 ms for a delayed ACK
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
    uv = uvicorn.Server(config)

    async def run() -> None:
        sock.listen(128)
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(sock.getsockname()[1]))
        os.replace(tmp, port_file)
        await uv.serve(sockets=[sock])

    asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=("stdio", "http"))
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--header", default="", help="NAME=VALUE every request must carry")
    parser.add_argument("--port", type=int, default=0, help="listen on this port (default: a free one)")
    args = parser.parse_args(argv)
    server = build()
    if args.transport == "stdio":
        server.run("stdio")
    else:
        serve_http(server, args.port_file, args.header, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
