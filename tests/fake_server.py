"""What the fake platform servers share: serving as a process of their own, and driving one from a test."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from aiohttp import web

REPO = Path(__file__).resolve().parent.parent


async def listen(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on host:port (0: a free port); the runner (to clean up) and the port it got."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # the port the OS chose for port=0


async def serve_until_stopped(server: Any, port_file: Path, lifetime: float, name: str) -> None:
    """Run ``server`` (an async context manager with ``.port``) until SIGTERM/SIGINT or ``lifetime`` s,
    writing its port to ``port_file`` once it listens."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server as running:
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(f"{running.port}\n")
        os.replace(tmp, port_file)  # readers never see a half-written port
        try:
            await asyncio.wait_for(stop.wait(), lifetime)
        except TimeoutError:
            print(f"{name}: lifetime of {lifetime:g} s over, stopping", file=sys.stderr)


class FakeServerProcess:
    """``python -m tests.<name> --port-file PATH --lifetime S ...`` as a child process, for synchronous
    end-to-end tests; every wait bounded. Subclasses name the module and add their arguments."""

    name = ""  # the module under tests/, e.g. "fake_models"

    def __init__(self, workdir: Path, *, lifetime: float = 600.0) -> None:
        self.workdir = Path(workdir)
        self.lifetime = lifetime
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def extra_args(self) -> list[str]:
        return []

    def start(self, timeout: float = 10.0):
        self.workdir.mkdir(parents=True, exist_ok=True)
        port_file = self.workdir / f"{self.name}.port"
        port_file.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", f"tests.{self.name}", "--port-file", str(port_file),
               "--lifetime", str(self.lifetime), *self.extra_args()]
        self.log_file = self.workdir / f"{self.name}.log"
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if port_file.exists():
                self.port = int(port_file.read_text())
                return self
            if self.proc.poll() is not None:
                err = self.log_file.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {err}")
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"{self.name} did not listen within {timeout} s")

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _call(self, method: str, path: str, data: Any = None, query: dict[str, Any] | None = None,
              timeout: float = 5.0) -> Any:
        """A JSON request to the server's control endpoints; an HTTP error becomes ValueError(body)."""
        q = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.url + path + ("?" + urllib.parse.urlencode(q) if q else "")
        body = json.dumps(data).encode() if data is not None else None
        req = urllib.request.Request(url, data=body, method=method, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise ValueError(e.read().decode(errors="replace")) from None
