"""The TCP addresses a home listens on, whether each is free, and which process holds one that is not
(from /proc/net/tcp{,6} and /proc/<pid>/fd; "in use" when that cannot be read)."""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass

from common.config import Config
from common.programs import gateway_name

FIRST_CONTROL_PORT = 7820
LISTEN_STATE = "0A"


@dataclass(frozen=True)
class Listen:
    address: str  # host:port as config.toml has it
    key: str  # the config key that asks for it
    program: str  # the program that binds it

    @property
    def host(self) -> str:
        return self.address.rpartition(":")[0].removeprefix("[").removesuffix("]")

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])


def _webhook_listen(platform: str, gw) -> bool:
    return {"telegram": gw.mode == "webhook", "slack": gw.mode == "events", "whatsapp": gw.mode == "cloud"}[platform]


def listens(cfg: Config) -> list[Listen]:
    """Every TCP address the home's services bind: control, webhook servers, tcp:// bus endpoints."""
    found = [Listen(cfg.control.listen, "[control] listen", "control")]
    for platform in ("telegram", "slack", "whatsapp"):
        for gw in getattr(cfg.gateways, platform):
            if _webhook_listen(platform, gw):
                found.append(Listen(gw.listen, f"gateways.{platform} {gw.id!r} listen",
                                    gateway_name(platform, gw.process)))
    for key in ("writer_endpoint", "events_endpoint"):
        endpoint = getattr(cfg.bus, key)
        if endpoint.startswith("tcp://"):
            found.append(Listen(endpoint.removeprefix("tcp://"), f"[bus] {key}", "writer"))
    return found


def clashes(cfg: Config) -> list[str]:
    """Addresses two programs would both bind (webhook servers of instances split across processes)."""
    by_address: dict[str, Listen] = {}
    problems = []
    for listen in listens(cfg):
        other = by_address.setdefault(listen.address, listen)
        if other.program != listen.program:
            problems.append(f"{other.key} ({other.program}) and {listen.key} ({listen.program}) both listen on"
                            f" {listen.address}: one address serves one process; give one of them another listen")
    return problems


def is_free(host: str, port: int) -> bool:
    """Whether a server could bind host:port now (as aiohttp and zmq do, with SO_REUSEADDR)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == LISTEN_STATE and int(local.rsplit(":", 1)[1], 16) == port:
                        inodes.add(inode)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return inodes


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    if "-m" in argv and "--home" in argv:  # a Starling service: say which one, of which home
        module, home = argv[argv.index("-m") + 1:][:1], argv[argv.index("--home") + 1:][:1]
        if module and home and module[0].startswith("services."):
            return f"pid {pid}, Starling's {module[0].removeprefix('services.')} of the home {home[0]}"
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = "?"
    shown = " ".join(argv)[:120] if argv else comm
    return f"pid {pid} ({shown})"


def holder(port: int) -> str:
    """Who listens on ``port``: "pid N (command line)", or "another program" when /proc does not say."""
    inodes = _listening_inodes(port)
    if inodes:
        wanted = {f"socket:[{inode}]" for inode in inodes}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fds = os.listdir(f"/proc/{entry}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{entry}/fd/{fd}") in wanted:
                        return _describe(int(entry))
                except OSError:
                    continue
    return "another program (its pid is not visible to this user)"


def busy(cfg: Config) -> list[str]:
    """One line per address the home would bind that is taken now: the port, the key and the holder."""
    problems = []
    for listen in {lst.address: lst for lst in listens(cfg)}.values():
        try:
            free = is_free(listen.host, listen.port)
        except OSError as exc:
            problems.append(f"{listen.key} = {listen.address!r}: cannot bind: {exc.strerror or exc}")
            continue
        if not free:
            problems.append(f"port {listen.port} ({listen.key} = {listen.address!r}) is in use by"
                            f" {holder(listen.port)}")
    return problems


def free_control_port(host: str = "127.0.0.1", taken: set[int] = frozenset(), first: int = FIRST_CONTROL_PORT) -> int:
    """The first port from ``first`` that is free now and not in ``taken`` (ports other homes are set to)."""
    for port in range(first, first + 1000):
        if port not in taken and is_free(host, port):
            return port
    with socket.socket() as sock:  # a thousand taken in a row: let the kernel pick one
        sock.bind((host, 0))
        return sock.getsockname()[1]
