"""In the forked child, before Landlock: a user + mount (+ network) namespace, hidden folders, no capabilities.

``enter`` runs between fork and exec (it only makes syscalls and writes to /proc/self). It unshares a user
namespace (mapping the runner's own uid and gid, nothing else), a mount namespace in which data_dir,
agents_dir and the other agents' private folders are covered by empty read-only tmpfs mounts (the agent's
own private folder is bound back in place), and, when the call was not approved for the network, a
network namespace with no interface up (no TCP, no UDP, not even loopback).

``drop_capabilities`` empties the bounding, ambient, effective, permitted and inheritable sets, so a
runner that runs as root starts commands that cannot use root's powers (no CAP_SYS_BOOT, no
CAP_DAC_OVERRIDE, no CAP_KILL over other users) and cannot regain them on exec.
"""

from __future__ import annotations

import ctypes
import os

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 47, 4
_CAP_V3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)
_unshare = _libc.unshare
_unshare.argtypes = [ctypes.c_int]
_mount = _libc.mount
_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_capset = _libc.capset


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def _fail(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mount_call(source: bytes | None, target: str, fstype: bytes | None, flags: int, data: bytes | None) -> None:
    if _mount(source, target.encode(), fstype, flags, data) != 0:
        raise _fail(f"mount {target}")


def enter(*, uid: int, gid: int, network: bool, hidden: tuple[str, ...], private_root: str,
          own_private_fd: int, own_name: str) -> None:
    """Unshare and hide. ``uid``/``gid`` are read in the parent (inside a fresh namespace they are unmapped)."""
    flags = CLONE_NEWUSER | CLONE_NEWNS | (0 if network else CLONE_NEWNET)
    if _unshare(flags) != 0:
        raise _fail("unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _mount_call(None, "/", None, MS_REC | MS_PRIVATE, None)  # nothing done here propagates back
    for path in hidden:
        _mount_call(b"tmpfs", path, b"tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k,mode=000")
    if private_root:
        # the source of a bind must be a mount of this namespace: reopen the folder after unshare
        own = os.path.join(private_root, own_name)
        fd = os.open(own, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        if os.path.samestat(os.fstat(fd), os.fstat(own_private_fd)):  # still the folder the rules name
            _mount_call(b"tmpfs", private_root, b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"size=4k,mode=711")
            os.mkdir(own, 0o700)
            _mount_call(f"/proc/self/fd/{fd}".encode(), own, None, MS_BIND | MS_REC, None)
        else:
            raise OSError(f"{own} changed while the sandbox was set up")
        os.close(fd)


def drop_capabilities() -> None:
    """No capability left, none to regain: a root runner's commands run as a powerless uid 0."""
    try:
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EPERM without CAP_SETPCAP: then there is nothing to drop
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAP_V3, 0)
    data = (_CapData * 2)()
    if _capset(ctypes.byref(header), data) != 0:
        raise _fail("capset")
