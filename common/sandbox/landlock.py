"""Landlock through ctypes: the ABI version, a ruleset built in the parent, and restrict_self in the child.

Landlock (Linux ≥ 5.13) is an allow-list a process applies to itself and to everything it starts: once
``restrict_self`` has run, only the rules' file hierarchies can be read, written or executed (per right),
TCP bind/connect need a rule (ABI ≥ 4), and signals and abstract unix sockets cannot cross out of the
domain (ABI ≥ 6); ptrace and /proc/<pid>/environ of processes outside the domain are denied at every ABI.
A sandboxed process can neither mount nor lift the rules. Rules name inodes, so the ruleset is built in
the runner (opening the paths) and only ``restrict_self`` runs in the forked child, before exec.

No library: the maintained Python bindings either need a compiled extension or lag the kernel's ABI;
the three syscalls and four structs below are the whole interface (see the kernel's
Documentation/userspace-api/landlock.rst).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

# The syscall numbers are the same on every architecture (added after the table was unified).
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH, RULE_NET_PORT = 1, 2

# filesystem rights, with the ABI that introduced each
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the only rights a file rule may carry
READ_EXEC = EXECUTE | READ_FILE | READ_DIR
READ_ONLY = READ_FILE | READ_DIR
READ_WRITE = (1 << 16) - 1 & ~(MAKE_CHAR | MAKE_BLOCK)  # everything but device nodes

PR_SET_NO_NEW_PRIVS = 38

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.restype = ctypes.c_int
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"landlock {what}: {os.strerror(err)}")
    return result


def abi_version() -> int:
    """The kernel's Landlock ABI (0 when Landlock is absent or disabled at boot)."""
    result = _syscall(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                      ctypes.c_uint32(CREATE_RULESET_VERSION))
    if result < 0:
        return 0  # ENOSYS (too old), EOPNOTSUPP (built in but off)
    return int(result)


@dataclass(frozen=True)
class Handled:
    """What a ruleset restricts at a given ABI: every right the kernel knows is denied unless a rule allows it."""

    abi: int
    fs: int
    net: int
    scoped: int

    @classmethod
    def for_abi(cls, abi: int, *, network: bool) -> "Handled":
        fs = _FS_BY_ABI.get(abi, _FS_BY_ABI[5]) if abi else 0
        # network allowed: TCP is not handled at all, so every port is open
        net = (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 and not network else 0
        scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0
        return cls(abi, fs, net, scoped)


class Ruleset:
    """A Landlock ruleset under construction in the parent; ``fd`` is handed to the child."""

    def __init__(self, handled: Handled) -> None:
        self.handled = handled
        attr = _RulesetAttr(handled.fs, handled.net, handled.scoped)
        size = 8 if handled.abi < 4 else 16 if handled.abi < 6 else 24
        self.fd = _check(_syscall(ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                                  ctypes.c_uint32(0)), "create_ruleset")
        os.set_inheritable(self.fd, False)

    def allow_path(self, path: str, rights: int) -> bool:
        """Allow ``rights`` beneath ``path`` (a file gets only file rights). False when the path is missing."""
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            return False
        try:
            if not os.path.isdir(f"/proc/self/fd/{pfd}"):
                rights &= FILE_RIGHTS
            rights &= self.handled.fs
            if not rights:
                return False
            attr = _PathBeneathAttr(rights, pfd)
            _check(_syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(self.fd), ctypes.c_int(RULE_PATH_BENEATH),
                            ctypes.byref(attr), ctypes.c_uint32(0)), f"add_rule {path}")
            return True
        finally:
            os.close(pfd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def restrict_self(ruleset_fd: int) -> None:
    """In the child: no_new_privs (required by Landlock), then enforce the ruleset on this process."""
    if _prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    _check(_syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)),
           "restrict_self")
