"""Kernel confinement for everything that runs code for an agent: shell commands, background jobs, MCP servers.

``probe(mode)`` finds, once per process, which layers this host really enforces (by starting a confined
``true``), ``policy_for`` says what one agent's command may reach, and ``spawn`` starts a program under
it. The layers, applied in the forked child before exec, in this order:

1. namespaces (where user namespaces work): a user + mount namespace in which data_dir, agents_dir and
   the other agents' private folders are empty, and a network namespace without interfaces unless the
   call was approved for the network (namespaces.py);
2. rlimits: CPU seconds, address space, file size, open files (and processes inside a user namespace,
   where the count is the sandbox's own; Linux never applies it to root);
3. every capability dropped, no_new_privs;
4. Landlock (the baseline, needing nothing installed): read+execute on the system, read-write on the
   shared workspace and the agent's own private folder, nothing else of the home; no TCP bind or
   connect (ABI ≥ 4) unless approved for the network; no signals or abstract unix sockets out of the
   sandbox (ABI ≥ 6), and no ptrace or /proc/<pid>/environ of Starling's processes (landlock.py).

The caller gives a clean environment and ``start_new_session`` (its own process group, killed whole).
Without Landlock (macOS, kernels before 5.13, Landlock off at boot) nothing is confined, and with
``[tools] sandbox = "auto"`` the tools that would run code are off; ``sandbox = "none"`` runs them
unconfined on purpose (the runner warns at every start).
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from common.sandbox import landlock, namespaces

SYSTEM_READ = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")
INFO_READ = ("/proc", "/sys")  # /proc/<pid> of Starling's processes stays closed: Landlock denies ptrace access
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")
NO_SANDBOX = "none"


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 600
    memory_mb: int = 4096
    file_mb: int = 1024
    open_files: int = 1024
    processes: int = 512


@dataclass(frozen=True)
class Policy:
    """What one confined program may reach (real paths)."""

    read_exec: tuple[str, ...]
    read_write: tuple[str, ...]
    hidden: tuple[str, ...]  # covered by empty mounts in the mount namespace
    private_root: str  # covered too, with own_private bound back
    own_private: str
    network: bool = False
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Sandbox:
    """The layers this process can enforce, found by ``probe``."""

    mode: str  # auto | none
    landlock_abi: int = 0
    namespaces: bool = False
    reason: str = ""  # why confinement is unavailable (or why a layer is missing)

    @property
    def confined(self) -> bool:
        return self.mode != NO_SANDBOX and self.landlock_abi > 0

    @property
    def usable(self) -> bool:
        """Tools that run code may run: confined, or unconfined because the operator said so."""
        return self.confined or self.mode == NO_SANDBOX

    def layers(self) -> list[str]:
        if self.mode == NO_SANDBOX:
            return ["none: [tools] sandbox = \"none\" (commands run unconfined, as the runner's user)"]
        if not self.confined:
            return []
        abi = self.landlock_abi
        parts = ["files"] + (["tcp"] if abi >= 4 else []) + (["signals", "abstract unix sockets"] if abi >= 6 else [])
        out = [f"landlock ABI {abi} ({', '.join(parts)})"]
        if self.namespaces:
            out.append("user+mount+network namespaces")
        out += ["no_new_privs", "capabilities dropped", "rlimits", "own process group", "clean environment"]
        return out

    def off_reason(self) -> str:
        """For the model and doctor when the code-running tools are off."""
        return ("this host cannot confine commands (" + (self.reason or "no Landlock") + "); the shell and"
                " background jobs are off. The operator can turn them on unconfined with"
                " [tools] sandbox = \"none\" in config.toml.")


def limits_for(shell: Any, *, job: bool = False) -> Limits:
    """The rlimits of ``[tools.shell]`` (a background job gets its own, longer, CPU budget)."""
    return Limits(cpu_s=shell.job_cpu_s if job else shell.cpu_s, memory_mb=shell.memory_mb,
                  file_mb=shell.file_mb, open_files=shell.open_files, processes=shell.processes)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def carve(root: str, forbidden: tuple[str, ...]) -> list[str]:
    """``root`` as rule paths that cover all of it except the ``forbidden`` trees (Landlock only allows).

    A root that holds a forbidden folder is replaced by its entries, recursively along the way down to
    it, so a home under /opt does not make its data folder readable through the /opt rule.
    """
    real = os.path.realpath(root)
    if any(_within(real, f) for f in forbidden):
        return []
    if not any(_within(f, real) for f in forbidden):
        return [real] if os.path.exists(real) else []
    out: list[str] = []
    try:
        names = sorted(os.listdir(real))
    except OSError:
        return []
    for name in names:
        out += carve(os.path.join(real, name), forbidden)
    return out


def forbidden_trees(paths: Any) -> tuple[str, ...]:
    """The home and every folder of Starling's own, as real paths: never readable by a command."""
    trees = {paths.home, paths.data_dir, paths.agents_dir, paths.private_root, paths.memories_dir}
    return tuple(sorted({os.path.realpath(p) for p in trees}))


def _program_dirs() -> list[str]:
    """Where the runner's PATH and its Python live, so programs outside the system folders still run."""
    dirs = [e for e in os.environ.get("PATH", "").split(os.pathsep) if e.startswith("/")]
    dirs += [sys.base_prefix, sys.prefix]
    return dirs


def policy_for(paths: Any, agent: str, limits: Limits, *, network: bool = False,
               extra_read: tuple[str, ...] = ()) -> Policy:
    forbidden = forbidden_trees(paths)
    own = os.path.realpath(paths.private_workspace(agent))
    shared = os.path.realpath(paths.shared_workspace)
    read: list[str] = []
    for root in (*SYSTEM_READ, *_program_dirs(), *extra_read):
        for rule in carve(root, forbidden):
            if not any(_within(rule, r) for r in read):
                read = [r for r in read if not _within(r, rule)] + [rule]
    private_root = os.path.realpath(paths.private_root)
    # mount-hide only what holds no part of the workspace, outermost first
    hidden: list[str] = []
    for tree in (os.path.realpath(paths.data_dir), os.path.realpath(paths.agents_dir),
                 os.path.realpath(paths.memories_dir)):
        if any(_within(w, tree) for w in (own, shared, private_root)) or not os.path.isdir(tree):
            continue
        if not any(_within(tree, h) for h in hidden):
            hidden = [h for h in hidden if not _within(h, tree)] + [tree]
    if any(_within(private_root, h) for h in hidden) or not _within(own, private_root):
        private_root = ""
    return Policy(read_exec=tuple(read), read_write=(shared, own), hidden=tuple(hidden),
                  private_root=private_root, own_private=own, network=network, limits=limits)


def _ruleset(sandbox: Sandbox, policy: Policy) -> landlock.Ruleset:
    rules = landlock.Ruleset(landlock.Handled.for_abi(sandbox.landlock_abi, network=policy.network))
    try:
        for path in policy.read_exec:
            rules.allow_path(path, landlock.READ_EXEC)
        for path in INFO_READ:
            rules.allow_path(path, landlock.READ_ONLY)
        for path in DEVICES:
            rules.allow_path(path, landlock.READ_FILE | landlock.WRITE_FILE | landlock.IOCTL_DEV)
        for path in policy.read_write:
            rules.allow_path(path, landlock.READ_WRITE)
    except BaseException:
        rules.close()
        raise
    return rules


def _set_limits(limits: Limits, *, processes: bool) -> None:
    mb = 1024 * 1024
    pairs = [(resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_mb * mb),
             (resource.RLIMIT_FSIZE, limits.file_mb * mb), (resource.RLIMIT_NOFILE, limits.open_files),
             (resource.RLIMIT_CORE, 0)]
    if processes:
        pairs.append((resource.RLIMIT_NPROC, limits.processes))
    for which, value in pairs:
        _soft, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def _prepare(sandbox: Sandbox, policy: Policy, cwd: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """(the function the child runs before exec, the parent's cleanup after the fork)."""
    if not sandbox.confined:
        def unconfined() -> None:
            _set_limits(policy.limits, processes=False)
        return unconfined, lambda: None
    rules = _ruleset(sandbox, policy)
    own_fd = os.open(policy.own_private, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    uid, gid = os.getuid(), os.getgid()
    use_ns = sandbox.namespaces
    own_name = os.path.basename(policy.own_private)
    ruleset_fd = rules.fd

    def confine() -> None:  # in the child, between fork and exec: syscalls only, nothing shared with the parent
        if use_ns:
            namespaces.enter(uid=uid, gid=gid, network=policy.network, hidden=policy.hidden,
                             private_root=policy.private_root, own_private_fd=own_fd, own_name=own_name)
            os.chdir(cwd)  # through the new mounts
        _set_limits(policy.limits, processes=use_ns)
        namespaces.drop_capabilities()
        landlock.restrict_self(ruleset_fd)

    def cleanup() -> None:
        rules.close()
        os.close(own_fd)

    return confine, cleanup


async def spawn(sandbox: Sandbox, policy: Policy, argv: list[str], *, cwd: str, env: dict[str, str],
                **kw: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` under ``policy``, in a session (process group) of its own."""
    child, cleanup = _prepare(sandbox, policy, cwd)
    try:
        return await asyncio.create_subprocess_exec(*argv, cwd=cwd, env=env, start_new_session=True,
                                                    preexec_fn=child, **kw)
    finally:
        cleanup()


def run_sync(sandbox: Sandbox, policy: Policy, argv: list[str], *, cwd: str, env: dict[str, str],
             timeout: float = 10.0) -> subprocess.CompletedProcess:
    """The same confinement for a blocking call (the probe, doctor, benchmarks)."""
    child, cleanup = _prepare(sandbox, policy, cwd)
    try:
        return subprocess.run(argv, cwd=cwd, env=env, start_new_session=True, preexec_fn=child,
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    finally:
        cleanup()


_probed: dict[str, Sandbox] = {}


def _probe_policy(folder: str) -> Policy:
    read = tuple(r for root in SYSTEM_READ for r in carve(root, ()))
    return Policy(read_exec=read, read_write=(folder,), hidden=(), private_root="", own_private=folder)


def probe(mode: str = "auto") -> Sandbox:
    """Which layers work here, tried for real once per process: a confined ``true`` must exit 0."""
    if mode in _probed:
        return _probed[mode]
    if mode == NO_SANDBOX:
        found = Sandbox(mode)
    elif not sys.platform.startswith("linux"):
        found = Sandbox(mode, reason=f"Landlock is Linux only; this is {sys.platform}")
    else:
        found = _probe_linux(mode)
    _probed[mode] = found
    return found


def _probe_linux(mode: str) -> Sandbox:
    abi = landlock.abi_version()
    if abi <= 0:
        return Sandbox(mode, reason="the kernel has no Landlock (Linux 5.13 or newer with landlock in lsm=)")
    true = "/bin/true" if os.path.exists("/bin/true") else "/usr/bin/true"
    folder = os.path.realpath(os.environ.get("TMPDIR") or "/tmp")
    env = {"PATH": "/usr/bin:/bin"}
    policy = _probe_policy(folder)
    problems = []
    for use_ns in (True, False):
        candidate = Sandbox(mode, landlock_abi=abi, namespaces=use_ns)
        try:
            done = run_sync(candidate, policy, [true], cwd=folder, env=env)
            if done.returncode == 0:
                return Sandbox(mode, landlock_abi=abi, namespaces=use_ns,
                               reason="; ".join(problems))
            problems.append(f"{'namespaces' if use_ns else 'landlock'}: exit {done.returncode}")
        except (OSError, subprocess.SubprocessError) as e:
            problems.append(f"{'user namespaces' if use_ns else 'landlock'} unavailable: {e}")
    return Sandbox(mode, reason="; ".join(problems))


def namespace_of(pid: int) -> str:
    """The user namespace a confined process runs in ("" when unknown): every process it starts shares it."""
    try:
        return os.readlink(f"/proc/{pid}/ns/user")
    except OSError:
        return ""


def kill_namespace(ns: str, *, rounds: int = 5) -> int:
    """SIGKILL every process in user namespace ``ns`` (what a ``setsid`` took out of the process group too)."""
    if not ns or ns == namespace_of(os.getpid()):
        return 0  # never our own namespace: an unconfined command shares the runner's
    killed = 0
    for _ in range(rounds):
        found = 0
        for entry in os.listdir("/proc"):
            if entry.isdigit() and namespace_of(int(entry)) == ns:
                found += 1
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        killed += found
        if not found:
            break
    return killed


def private_tmp(folder: Path) -> Path:
    """The command's TMPDIR: inside its private folder, so it is writable under the sandbox."""
    tmp = folder / ".tmp"
    tmp.mkdir(mode=0o700, exist_ok=True)
    return tmp
