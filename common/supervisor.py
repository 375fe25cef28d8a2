"""Talking to the supervisord that runs one home's services: start it, ask it, stop it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import functools
from dataclasses import dataclass
from pathlib import Path

from common import lean, supervisor_conf
from common.config import Config
from common.errors import StarlingError
from common.home import Paths
from common.programs import PLATFORMS, expected_services  # noqa: F401 - re-exported for callers

LOG_MAXBYTES = "10MB"
LOG_BACKUPS = 5
RPC_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ProcessInfo:
    name: str  # "writer", "runner-0", "gateway-telegram", ...
    group: str
    state: str  # supervisord's: RUNNING, STARTING, BACKOFF, STOPPED, EXITED, FATAL, ...
    pid: int
    started: float
    description: str
    exit_status: int


def socket_path(paths: Paths) -> Path:
    return paths.run_dir / "supervisor.sock"


def pid_file(paths: Paths) -> Path:
    return paths.run_dir / "supervisord.pid"


def environment(paths: Paths, cfg: Config, log_maxbytes: str = LOG_MAXBYTES) -> dict[str, str]:
    """The variables the rendered supervisord.conf leaves to supervisord's environment, and where the home is."""
    return {
        "STARLING_HOME": str(paths.home),
        "STARLING_DATA": str(paths.data_dir),
        "STARLING_PYTHON": sys.executable,
        "STARLING_LOG_MAXBYTES": os.environ.get("STARLING_LOG_MAXBYTES", log_maxbytes),
        "STARLING_LOG_BACKUPS": str(LOG_BACKUPS),
    }


@functools.cache
def _rpc_classes():
    """supervisor's XML-RPC transport, imported at first use: control imports this module but asks
    supervisord only when status is asked for (supervisor.xmlrpc costs ~1.8 MB of RSS per process, and
    xmlrpc.client with pyexpat and gzip ~0.4 MB more: it is imported here and in each method using it)."""
    from supervisor.xmlrpc import SupervisorTransport, UnixStreamHTTPConnection

    class _BoundedConnection(UnixStreamHTTPConnection):
        """A wedged supervisord (stopped, overloaded) must not hang the CLI: every socket call is bounded."""

        def connect(self) -> None:
            super().connect()
            self.sock.settimeout(self.timeout)

    return SupervisorTransport, _BoundedConnection


class Supervisor:
    """An XML-RPC client of this home's supervisord, over its 0700 unix socket."""

    def __init__(self, paths: Paths) -> None:
        self.paths = paths
        self.url = f"unix://{socket_path(paths)}"

    def _proxy(self):
        import xmlrpc.client

        SupervisorTransport, _BoundedConnection = _rpc_classes()
        transport = SupervisorTransport(None, None, self.url)
        socket_file = str(socket_path(self.paths))

        def connection():
            conn = _BoundedConnection("localhost", timeout=RPC_TIMEOUT_S)
            conn.socketfile = socket_file
            return conn

        transport._get_connection = connection
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport)

    def reachable(self) -> bool:
        import xmlrpc.client

        if not socket_path(self.paths).exists():
            return False
        try:
            return self._proxy().supervisor.getState()["statename"] == "RUNNING"
        except (OSError, xmlrpc.client.Error):
            return False

    def processes(self) -> list[ProcessInfo]:
        import xmlrpc.client

        try:
            infos = self._proxy().supervisor.getAllProcessInfo()
        except (OSError, xmlrpc.client.Error) as exc:
            raise StarlingError(f"supervisord at {self.url} did not answer: {exc}") from None
        return [
            ProcessInfo(i["name"], i["group"], i["statename"], i["pid"], float(i["start"]), i["description"],
                        i["exitstatus"])
            for i in infos
        ]

    def supervisord_pid(self) -> int | None:
        import xmlrpc.client

        try:
            return int(self._proxy().supervisor.getPID())
        except (OSError, xmlrpc.client.Error):
            return None

    def start_daemon(self, cfg: Config, foreground: bool = False) -> subprocess.Popen | None:
        """Start supervisord for this home (daemonised, or in the foreground for containers)."""
        env = {**lean.PROCESS_ENVIRONMENT, **os.environ, **environment(self.paths, cfg)}
        os.umask(0o077)  # supervisord opens its own log before it applies the config's umask
        conf = supervisor_conf.write(self.paths, cfg)
        command = [sys.executable, "-m", "common.supervisord_run", "-c", str(conf)]
        if foreground:
            os.execvpe(command[0], [*command, "--nodaemon"], env)
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
        if result.returncode != 0:
            raise StarlingError(f"supervisord did not start: {(result.stderr or result.stdout).strip()}")
        return None

    def wait_reachable(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.reachable():
                return True
            time.sleep(0.05)
        return False

    def shutdown(self) -> None:
        self._proxy().supervisor.shutdown()

    def start_process(self, name: str, wait: bool = True) -> None:
        self._rpc("startProcess", self._full_name(name), wait)

    def stop_process(self, name: str, wait: bool = True) -> None:
        self._rpc("stopProcess", self._full_name(name), wait)

    def signal_process(self, name: str, signal_name: str) -> None:
        self._rpc("signalProcess", self._full_name(name), signal_name)

    def update(self, paths: Paths, cfg: Config) -> tuple[list[str], list[str], list[str]]:
        """Render the home's supervisord.conf again and apply it as `supervisorctl update` does: programs
        gone are stopped and removed, new ones added (and so started), changed ones replaced.
        Returns (added, changed, removed) program names."""
        supervisor_conf.write(paths, cfg)
        added, changed, removed = self._rpc("reloadConfig")[0]
        for name in [*removed, *changed]:
            self._rpc("stopProcessGroup", name, True)
            self._rpc("removeProcessGroup", name)
        for name in [*changed, *added]:
            self._rpc("addProcessGroup", name)
        return sorted(added), sorted(changed), sorted(removed)

    def _rpc(self, method: str, *args):
        import xmlrpc.client

        try:
            return getattr(self._proxy().supervisor, method)(*args)
        except xmlrpc.client.Fault as fault:
            raise StarlingError(f"supervisord refused {method}{args!r}: {fault.faultString}") from None
        except OSError as exc:
            raise StarlingError(f"supervisord at {self.url} did not answer: {exc}") from None

    def _full_name(self, name: str) -> str:
        for info in self.processes():
            if info.name == name:
                return f"{info.group}:{info.name}"
        raise StarlingError(f"no service named {name!r}")
