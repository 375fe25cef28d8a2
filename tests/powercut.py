"""A power cut for SQLite: a recording VFS, and the bytes a disk would hold after a cut at any point.

The VFS (apsw, inheriting the real "unix" one) passes every call through and appends each write,
truncate, sync and delete to an operation log. A power cut after operation k is then rebuilt
from the log, as an OS page cache would leave it: per file, only what a completed xSync covered
survives; writes issued since that file's last sync are lost, or (``chaos``) each kept, dropped
or torn at 512-byte sectors at random, as a disk flushing its cache in any order might. Recording
one run and cutting it at many points is the same as many runs each cut at one point: nothing
before a cut can know it is coming.

`python -m tests.powercut OPLOG [--synchronous MODE] --home H` runs the real writer (its main()
unchanged) with this VFS as SQLite's default; ``--synchronous MODE`` swaps the writer's
synchronous FULL for MODE, to show that the test catches a writer that does not sync.
"""

from __future__ import annotations

import os
import random
import stat
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import apsw

SECTOR = 512
_HEAD = struct.Struct("<cIQI")  # kind, name length, offset (or size, or syncdir), data length


@dataclass(frozen=True)
class Op:
    kind: str  # W write | T truncate | S sync | D delete | F folder synced
    name: str  # the file's base name
    offset: int  # W: where; T: the new size; D: 1 when the folder was synced
    data: bytes
    end: int  # the log's size once this op was recorded


class _Log:
    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def put(self, kind: bytes, name: str, offset: int, data: bytes = b"") -> None:
        raw = os.path.basename(name).encode()
        os.write(self.fd, _HEAD.pack(kind, len(raw), offset, len(data)) + raw + data)


class RecordingFile(apsw.VFSFile):
    def __init__(self, log: _Log, name, flags) -> None:
        super().__init__("unix", name, flags)
        self._log = log
        self._name = name.filename() if isinstance(name, apsw.URIFilename) else str(name)

    def xWrite(self, data, offset) -> None:
        self._log.put(b"W", self._name, offset, bytes(data))
        super().xWrite(data, offset)

    def xTruncate(self, size) -> None:
        self._log.put(b"T", self._name, size)
        super().xTruncate(size)

    def xSync(self, flags) -> None:
        super().xSync(flags)
        self._log.put(b"S", self._name, 0)  # recorded once done: a sync in the log has completed


class RecordingVFS(apsw.VFS):
    def __init__(self, log_path: Path) -> None:
        self._log = _Log(log_path)
        super().__init__("powercut", "unix", makedefault=True)

    def xOpen(self, name, flags):
        return RecordingFile(self._log, name, flags)

    def xDelete(self, name, syncdir) -> None:
        super().xDelete(name, syncdir)
        self._log.put(b"D", name, 1 if syncdir else 0)


def read_log(path: Path) -> list[Op]:
    raw = path.read_bytes()
    ops, at = [], 0
    while at + _HEAD.size <= len(raw):
        kind, name_len, offset, data_len = _HEAD.unpack_from(raw, at)
        end = at + _HEAD.size + name_len + data_len
        if end > len(raw):
            break  # a record the writer was still appending when it was stopped
        start = at + _HEAD.size
        ops.append(Op(kind.decode(), raw[start:start + name_len].decode(), offset,
                      raw[start + name_len:end], end))
        at = end
    return ops


def _apply(content: bytearray, op: Op) -> None:
    if op.kind == "T":
        del content[op.offset:]
    elif op.kind == "W":
        if len(content) < op.offset:
            content.extend(bytes(op.offset - len(content)))
        content[op.offset:op.offset + len(op.data)] = op.data


def _chaos_apply(content: bytearray, op: Op, rng: random.Random) -> None:
    """An unsynced op as a disk may leave it: whole, lost, or (a write) torn at sector bounds."""
    if op.kind != "W" or len(op.data) <= SECTOR:
        if rng.random() < 0.5:
            _apply(content, op)
        return
    for start in range(0, len(op.data), SECTOR):
        if rng.random() < 0.5:
            _apply(content, Op("W", op.name, op.offset + start, op.data[start:start + SECTOR], op.end))


@dataclass
class _Inode:
    durable: bytearray = field(default_factory=bytearray)
    pending: list[Op] = field(default_factory=list)
    dir_synced: bool = False


def survivors(ops: list[Op], cut: int, chaos: random.Random | None = None) -> dict[str, bytes]:
    """Each file's bytes after a power cut once ``ops[:cut]`` were issued.

    Contents: what a completed xSync of that file covered, plus (``chaos``) any part of the rest.
    Names (creating, unlinking a file) are folder changes: durable once the folder is synced (an
    F op: os.fsync of the folder; an xDelete with syncdir; the unix VFS's own folder sync on the
    first sync of a new journal or WAL), else lost, or (``chaos``) kept up to a random point, in
    order, as a journaling file system commits them.
    """
    inodes: list[_Inode] = []
    current: dict[str, int] = {}  # name -> inode, as the running process sees the folder
    durable_dir: dict[str, int] = {}
    dir_pending: list[tuple[str, int | None]] = []  # (name, inode or None for an unlink)

    def sync_folder() -> None:
        for name, inode in dir_pending:
            if inode is None:
                durable_dir.pop(name, None)
            else:
                durable_dir[name] = inode
        dir_pending.clear()

    for op in ops[:cut]:
        if op.kind == "F":
            sync_folder()
        elif op.kind == "D":
            if current.pop(op.name, None) is not None:
                dir_pending.append((op.name, None))
            if op.offset:
                sync_folder()
        else:
            if op.name not in current:
                current[op.name] = len(inodes)
                inodes.append(_Inode())
                dir_pending.append((op.name, current[op.name]))
            inode = inodes[current[op.name]]
            if op.kind == "S":
                for queued in inode.pending:
                    _apply(inode.durable, queued)
                inode.pending.clear()
                if not inode.dir_synced and op.name.endswith(("-wal", "-journal")):
                    inode.dir_synced = True
                    sync_folder()
            else:
                inode.pending.append(op)
    if chaos is not None:
        for name, inode in dir_pending[:chaos.randint(0, len(dir_pending))]:
            if inode is None:
                durable_dir.pop(name, None)
            else:
                durable_dir[name] = inode
        for inode in inodes:
            for op in inode.pending:
                _chaos_apply(inode.durable, op, chaos)
    return {name: bytes(inodes[i].durable) for name, i in durable_dir.items()}


def materialize(files: dict[str, bytes], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)


def main(argv: list[str]) -> int:
    log_path, rest = Path(argv[0]), argv[1:]
    if rest[:1] == ["--synchronous"]:
        from common.stores import db_store

        mode = rest[1]
        db_store.WRITER_PRAGMAS = tuple(
            p.replace("FULL", mode) if "synchronous" in p else p for p in db_store.WRITER_PRAGMAS
        )
        rest = rest[2:]
    vfs = RecordingVFS(log_path)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # a folder's fsync makes its names durable: the model needs to see it
        real_fsync(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            vfs._log.put(b"F", os.readlink(f"/proc/self/fd/{fd}"), 0)

    os.fsync = fsync
    from services.writer import main as writer

    return writer.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
