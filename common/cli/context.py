"""What most verbs need: the home, its config and paths, a reader, and a writer call from sync code."""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from common import bus, db
from common.config import Config, load_config
from common.errors import StarlingError
from common.home import Paths, paths_for, resolve_home
from common.secrets import session_secret
from schema import messages as m


@dataclass
class Context:
    home: Path

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Context:
        return cls(resolve_home(args.home))

    @cached_property
    def cfg(self) -> Config:
        return load_config(self.home / "config.toml")

    @cached_property
    def paths(self) -> Paths:
        return paths_for(self.home, self.cfg)

    @cached_property
    def endpoints(self) -> bus.Endpoints:
        return bus.endpoints(self.paths.run_dir, self.cfg.bus.writer_endpoint, self.cfg.bus.events_endpoint)

    def reader(self):
        """A read-only connection; a clear error when there is no database yet."""
        return db.open_reader(self.paths.db_file)

    def call(self, op: m.WriteOp, timeout_s: float = 30.0, on_wait=None, long: bool = False) -> m.Result | None:
        """One write through the writer, from sync code. ``on_wait()`` is called about 10x a second.

        ``long`` operations (backup, FTS rebuild) are not resent while the writer works on them."""
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
                        raise StarlingError(f"{exc}; is Starling running? (`starling up`)") from None
                if on_wait:
                    on_wait()
