"""Test helpers: temporary homes and real Starling processes, always stopped, every wait bounded."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from common import bus
from common.config import Config, default_config_text, load_config
from common.home import Paths, ensure_layout, paths_for
from common.secrets import session_secret

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Home:
    root: Path
    cfg: Config
    paths: Paths
    key: bytes
    endpoints: bus.Endpoints

    def client(self, name: str = "test", **kw) -> bus.WriterClient:
        return bus.WriterClient(self.endpoints.writer, self.key, name=name, **kw)

    def subscriber(self, topics: list[str], **kw) -> bus.EventSubscriber:
        return bus.EventSubscriber(self.endpoints.events, self.key, topics, **kw)


def make_home(extra_config: str = "", root: Path | None = None, keep_config: bool = False) -> Home:
    """A fresh home under /tmp (short, so ipc socket paths fit): the commented default config, or ``extra_config``
    (TOML; every key it leaves out has its default).

    With ``keep_config``, an existing home is opened as it is (for helper processes of a test).
    """
    root = root or Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    if not keep_config:
        (root / "config.toml").write_text(extra_config or default_config_text())
    cfg = load_config(root / "config.toml")
    paths = paths_for(root, cfg)
    ensure_layout(paths)
    key = bus.bus_key(session_secret(paths))
    return Home(root, cfg, paths, key, bus.endpoints(paths.run_dir, cfg.bus.writer_endpoint, cfg.bus.events_endpoint))


def remove_home(home: Home) -> None:
    shutil.rmtree(home.root, ignore_errors=True)


class Proc:
    """A service process started as in production (``python -m services.X --home H``), logging to a file."""

    def __init__(self, home: Home, service: str, *args: str, module: str = "") -> None:
        self.home = home
        self.service = service
        self.log_file = home.paths.logs_dir / f"{service}.log"
        self._log = open(self.log_file, "ab")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", module or f"services.{service}", "--home", str(home.root), *args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()
        return self.popen.returncode

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace")


def start_writer(home: Home, timeout: float = 15.0) -> Proc:
    proc = Proc(home, "writer")
    # a thread of its own, so tests running an event loop can call this too
    with ThreadPoolExecutor(1) as pool:
        answered = pool.submit(asyncio.run, _ping(home, timeout)).result()
    if not answered:
        proc.stop()
        raise RuntimeError(f"the writer did not answer in {timeout}s:\n{proc.log_text()}")
    return proc


async def _ping(home: Home, timeout: float) -> bool:
    async with home.client("ping", timeout_s=0.2) as client:
        return await client.ping(timeout)


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def ctrl_c_works() -> None:
    """Popen's preexec_fn for a child a test stops with SIGINT as a terminal's Ctrl-C would: a shell without
    job control starts background jobs (a CI runner's `cmd &`) with SIGINT ignored, and children inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
