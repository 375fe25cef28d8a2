"""What most verbs need: the home, its config and paths, a reader, and a writer call from sync code."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import socket
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from common import bus, db, registry
from common.config import Config, load_config
from common.errors import StarlingError
from common.home import Paths, paths_for, resolve_home
from common.secrets import session_secret
from schema import messages as m


NOT_RUNNING = "Starling is not running (start it with `starling up`)"
PROBE_TIMEOUT_S = 1.0


def listening(endpoint: str) -> bool:
    """Whether something accepts connections at a bus endpoint (ipc:// path or tcp://host:port): a writer
    that is not running is told at once, not after the request's whole deadline."""
    try:
        if endpoint.startswith("ipc://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(PROBE_TIMEOUT_S)
                sock.connect(endpoint.removeprefix("ipc://"))
        elif endpoint.startswith("tcp://"):
            host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
            with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S):
                pass
        return True
    except (OSError, ValueError):
        return False


@dataclass
class Context:
    home: Path

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Context:
        return cls(resolve_home(args.home))

    @cached_property
    def cfg(self) -> Config:
        config = self.home / "config.toml"
        if not config.exists() and not config.is_symlink():
            raise StarlingError(no_home(self.home))
        return load_config(config)

    @cached_property
    def paths(self) -> Paths:
        return paths_for(self.home, self.cfg)

    @cached_property
    def endpoints(self) -> bus.Endpoints:
        return bus.endpoints(self.paths.run_dir, self.cfg.bus.writer_endpoint, self.cfg.bus.events_endpoint)

    def running_paths(self) -> Paths:
        """The paths of the running services: those of config.toml, or, when the home runs with a data_dir
        config.toml no longer names (its run file says), that one, so `down` still finds supervisord."""
        entry = registry.entry_for(self.home)
        if entry is None or not entry.data or Path(entry.data) == self.paths.data_dir:
            return self.paths
        return dataclasses.replace(self.paths, data_dir=Path(entry.data))

    def reader(self):
        """A read-only connection; a clear error when there is no database yet."""
        return db.open_reader(self.paths.db_file)

    def call(self, op: m.WriteOp, timeout_s: float = 30.0, on_wait=None, long: bool = False) -> m.Result | None:
        """One write through the writer, from sync code. ``on_wait()`` is called about 10x a second.

        ``long`` operations (backup, FTS rebuild) are not resent while the writer works on them."""
        if not listening(self.endpoints.writer):
            raise StarlingError(f"{NOT_RUNNING}: no writer at {self.endpoints.writer}")
        return asyncio.run(self._call(op, timeout_s, on_wait, long))

    async def _call(self, op: m.WriteOp, timeout_s: float, on_wait, long: bool) -> m.Result | None:
        key = bus.bus_key(session_secret(self.paths))
        resend_s = timeout_s if long else self.cfg.bus.request_timeout_ms / 1000
        async with bus.WriterClient(self.endpoints.writer, key, name="cli", deadline_s=timeout_s,
                                    timeout_s=resend_s) as client:
            task = asyncio.ensure_future(client.call(op))
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.1)
                if done:
                    try:
                        return task.result()
                    except bus.BusTimeout as exc:
                        raise StarlingError(f"{exc}; the writer did not answer (`starling status` shows it)") from None
                if on_wait:
                    on_wait()


def shown(home: Path) -> str:
    """The home as the operator would write it: ./.starling for the default in this folder."""
    try:
        relative = home.relative_to(Path.cwd())
    except ValueError:
        return str(home)
    return f"./{relative}"


def no_home(home: Path) -> str:
    """Why a command cannot run here, and the homes it may have meant (those running on this host)."""
    if home.exists() and not home.is_dir():
        text = f"--home {shown(home)} is a file, not a Starling home (a folder)"
    else:
        text = f"no Starling home at {shown(home)}: use --home or STARLING_HOME (`starling init` makes one)"
    running = registry.listing()
    return f"{text}\n{running}" if running else text
