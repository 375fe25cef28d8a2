"""What every service does at start: read --home and the config, lay out the home, log, stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from common import bus, service_args
from common.config import Config, load_config
from common.errors import StarlingError
from common.home import Paths, ensure_layout, paths_for, resolve_home
from common.log import setup_logging
from common.secrets import register_known_secrets, session_secret


@dataclass
class Service:
    name: str
    paths: Paths
    cfg: Config
    log: Any
    key: bytes
    endpoints: bus.Endpoints
    stopping: threading.Event
    args: Any = None  # the command line (common/service_args.py), with the options a service added to boot's
    # SIGHUP before the service's Runtime took the signal over: the Runtime re-reads the config at its start
    hangup: threading.Event = field(default_factory=threading.Event)


def boot(name: str, argv: list[str] | None = None, description: str = "",
         add_arguments: service_args.AddArguments | None = None) -> Service:
    """Parse ``--home`` (and the options ``add_arguments`` adds, so ``--help`` shows them), load and check
    the config, create the layout; exit 1 with a clear line on error."""
    options = service_args.Options()
    options.add_argument("--home", help="Starling home (default: $STARLING_HOME or ./.starling)")
    options.add_argument("--name", help="this process's name in status and logs (default: supervisord's"
                         " process name, else the service's)")
    if add_arguments is not None:
        add_arguments(options)
    args = service_args.parse(sys.argv[1:] if argv is None else argv, f"starling-{name}", description, options)
    os.umask(0o077)  # every file a service creates is private to its user, whatever umask it was given
    name = args.name or os.environ.get("SUPERVISOR_PROCESS_NAME") or name
    log = setup_logging(name)
    try:
        home = resolve_home(args.home)
        cfg = load_config(home / "config.toml")
        paths = paths_for(home, cfg)
        ensure_layout(paths)
        key = bus.bus_key(session_secret(paths))
        register_known_secrets(paths, cfg)  # before any work: every value known is redacted from the start
        endpoints = bus.endpoints(paths.run_dir, cfg.bus.writer_endpoint, cfg.bus.events_endpoint)
    except StarlingError as exc:
        log.error("startup_failed", error=str(exc))
        sys.exit(1)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()  # first: the log line below can fail when stdout is gone
        try:
            log.info("stop_requested", reason=f"signal {signal.Signals(signum).name}")
        except OSError:
            pass

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    svc = Service(name, paths, cfg, log, key, endpoints, stopping, args)
    signal.signal(signal.SIGHUP, lambda _signum, _frame: svc.hangup.set())  # `starling reload`; never fatal
    return svc


def notify_systemd(state: str) -> None:
    """sd_notify(3) without libsystemd: READY=1, WATCHDOG=1, STOPPING=1; a no-op outside systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(address)
            sock.sendall(state.encode())
        except OSError:
            pass


def watchdog_interval_s() -> float | None:
    """Half of systemd's WatchdogSec for this process, or None when no watchdog is asked for."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2_000_000
