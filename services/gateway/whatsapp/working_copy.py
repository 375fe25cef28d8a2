"""whatsmeow's SQLite session database, which neonize opens by file name, kept encrypted at rest:
decrypted from the session store into a private folder (tmpfs where there is one) while the client
runs, and saved back, encrypted, whenever its bytes changed and at stop.

A copy is taken only when it is consistent: no rollback journal (a write in progress), and the files'
size, mtime and inode, and the header's change counter, the same before and after reading them. This
reads the files as bytes, never through a second SQLite library in the process (two copies of SQLite
in one process do not see each other's locks). The folder is removed at stop; after a crash the next
start removes what was left, so plaintext outlives the process only on a tmpfs, until the next start
or a reboot.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import msgspec

from common.errors import StarlingError
from services.gateway.whatsapp.session_vault import SessionVault

DB_KEY = "whatsmeow.db"
DB_NAME = "whatsmeow.db"
HEADER = b"SQLite format 3\x00"
TMPFS = Path("/dev/shm")
TRIES = 20


class Snapshot(msgspec.Struct, frozen=True):
    db: bytes
    wal: bytes = b""


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(Snapshot).decode


def work_folder(store: SessionVault, fallback: Path | None = None) -> tuple[Path, bool]:
    """(the private folder for this store's working copy, whether it is on a tmpfs). One per session
    folder (named from its path), so two homes on one machine never share one."""
    tag = hashlib.sha256(str(store.folder.resolve()).encode()).hexdigest()[:16]
    name = f"starling-{os.getuid()}-wa-{tag}"
    if TMPFS.is_dir() and os.access(TMPFS, os.W_OK | os.X_OK):
        return TMPFS / name, True
    return (fallback or Path(tempfile.gettempdir())) / name, False


class WorkingCopy:
    def __init__(self, store: SessionVault, folder: Path) -> None:
        self.store = store
        self.folder = Path(folder)
        self.db = self.folder / DB_NAME
        self.saved: tuple | None = None  # the files' signature when last saved

    def restore(self) -> bool:
        """Fresh folder (0700), the stored database decrypted into it (0600). False: nothing stored yet."""
        self.wipe()
        try:
            self.folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.folder.mkdir(mode=0o700)  # not exist_ok: a folder another user made in /dev/shm is refused
        except FileExistsError:
            raise StarlingError(f"{self.folder}: exists and cannot be removed; refusing to put the WhatsApp"
                                " session there (remove it)") from None
        except OSError as exc:
            raise StarlingError(f"{self.folder}: cannot create the working folder: {exc.strerror}") from None
        os.chmod(self.folder, 0o700)
        blob = self.store.get(DB_KEY)
        if blob is None:
            return False
        snap = _decode(blob)
        _write(self.db, snap.db)
        if snap.wal:
            _write(self._wal, snap.wal)
        self.saved = self._signature()
        return True

    def save(self, force: bool = False) -> bool:
        """Encrypt the database into the store if it changed since the last save. True when saved; False
        when unchanged, missing, or never still long enough to copy consistently (the next save tries again)."""
        if not self.db.exists():
            return False
        if not force and self._signature() == self.saved:
            return False
        for _ in range(TRIES):
            taken = self._consistent_copy()
            if taken is not None:
                snap, signature = taken
                self.store.put(DB_KEY, _encode(snap))
                self.saved = signature
                return True
            time.sleep(0.01)
        return False

    def wipe(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def _wal(self) -> Path:
        return self.db.with_name(DB_NAME + "-wal")

    @property
    def _journal(self) -> Path:
        return self.db.with_name(DB_NAME + "-journal")

    def _signature(self) -> tuple:
        out = []
        for path in (self.db, self._wal):
            try:
                st = path.stat()
                out.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except FileNotFoundError:
                out.append(None)
        return tuple(out)

    def _consistent_copy(self) -> tuple[Snapshot, tuple] | None:
        if self._journal.exists():
            return None  # a write transaction is under way
        before = self._signature()
        try:
            db = self.db.read_bytes()
            wal = self._wal.read_bytes() if before[1] is not None else b""
        except FileNotFoundError:
            return None
        if self._journal.exists() or self._signature() != before or not _whole(db):
            return None
        return Snapshot(db, wal), before


def _whole(db: bytes) -> bool:
    """A database image whose header agrees with its length (an empty file is a database not made yet)."""
    if not db:
        return True
    if len(db) < 100 or not db.startswith(HEADER):
        return False
    page = int.from_bytes(db[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(db[28:32], "big")
    changes, valid_for = db[24:28], db[92:96]
    return changes != valid_for or pages * page == len(db)


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
