"""Who a process is: its worker id (name, host and a boot id of its own), and whether a process recorded
under a name is provably gone.

A worker id is ``<name>@<host>/<boot>``: ``boot`` is random per process, so two processes under one name
(a restart, or a twin) never share leases. What a process held is taken back by its successor at once
only when the predecessor is provably gone (services/writer/lease_ops.py):

- same pid scope (one host boot, one pid namespace: the writer's own): the recorded pid no longer runs
  the process that started at the recorded time (``/proc/<pid>/stat`` start time; a zombie is gone);
- the same host name under another host boot: the host rebooted, everything on it died;
- otherwise (another host, another pid namespace): its last sign of life is older than the staleness
  the newcomer names (heartbeats and leases).
A live predecessor refuses the newcomer ("a live twin is refused, never raced", DESIGN rule 6).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import NamedTuple

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


class Identity(NamedTuple):
    name: str  # the process's name (--name, supervisord's process name, or the service's)
    worker: str  # <name>@<host>/<boot>: the owner of every lease this process takes
    pid: int
    pid_start: int  # the pid's start time in clock ticks since the host booted (0: unknown)
    host: str
    pid_scope: str  # <host boot id>:<pid namespace>: where ``pid`` means this process


def this_process(name: str) -> Identity:
    host = socket.gethostname()
    pid = os.getpid()
    return Identity(name, f"{name}@{host}/{uuid.uuid4().hex[:12]}", pid, process_start(pid) or 0, host, pid_scope())


def host_boot_id() -> str:
    """The kernel's id of this boot of the host ("" when unknown: then every start looks like a new boot)."""
    try:
        with open(BOOT_ID_FILE) as f:
            return f.read().strip()
    except OSError:
        return ""


def pid_scope() -> str:
    """Where a pid names one process: this host boot and this pid namespace ("" when unknown)."""
    boot = host_boot_id()
    if not boot:
        return ""
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        namespace = "?"
    return f"{boot}:{namespace}"


def scope_boot(scope: str) -> str:
    return scope.partition(":")[0]


def boottime() -> float:
    """Seconds since the host booted, counting suspend (CLOCK_BOOTTIME): monotonic, untouched by changes of
    the wall clock. Falls back to CLOCK_MONOTONIC where there is no CLOCK_BOOTTIME."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    if clock is None:
        return time.monotonic()
    return time.clock_gettime(clock)


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), or None when it is gone (a zombie is)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (IndexError, ValueError):
        return None


def still_runs(pid: int, pid_start: int) -> bool:
    """Whether ``pid`` is still the process that started at ``pid_start`` (in this pid scope)."""
    started = process_start(pid)
    return started is not None and (not pid_start or started == pid_start)
