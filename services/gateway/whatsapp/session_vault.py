"""The linked device's session at rest: a key-value store of bytes in `data/whatsapp/<instance>/`, each
value one file encrypted with AES-256-GCM under a key derived from the session secret.

- The key: HKDF-SHA256 over the session secret (`SESSION_SECRET` or `data/.session-secret`) with a
  purpose label naming the instance, so no other use of that secret (the bus's HMAC key) and no other
  instance shares it.
- A file: `SWS1` (format and version), a fresh random 96-bit nonce, the ciphertext and its 16-byte tag.
  The associated data binds the instance and the value's name, so a file copied over another (one
  contact's session over another's) is refused like a flipped byte.
- `put` returns once the value is durable: written to a temporary file, fsynced, renamed over the old
  one, the folder fsynced (common.home.write_private_file). A crash leaves the old value or the new one,
  never a mix; leftover temporary files are removed when the store is next locked. Files 0600, folders 0700.
- `check`, written once with the first value, tells a wrong key apart from a damaged file: a store whose
  check does not open was written under another session secret. Neither is ever replaced or reset
  here: the error names the file and the way out (the old secret back, or `starling whatsapp unlink`).
- One user at a time: `lock()` takes an exclusive lock (`.lock`, with the holder's pid), held by the
  gateway while it runs the session, or by `starling whatsapp link|unlink`.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from pathlib import Path
from urllib.parse import quote, unquote

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.errors import StarlingError
from common.home import Paths, fsync_dir, make_private_dir, write_private_file
from common.secrets import session_secret

MAGIC = b"SWS1"
NONCE_BYTES = 12
SUFFIX = ".enc"
CHECK = "check"           # a value of its own, written with the first put: proves the key
CHECK_TEXT = b"starling whatsapp session store"
LOCK_FILE = ".lock"
PURPOSE = b"starling/whatsapp-linked-session/v1/"


class SessionError(StarlingError):
    """A session file that cannot be read as written: damaged, tampered with, or under another key."""


class SessionBusy(StarlingError):
    """Another process holds the session (the gateway, or a `starling whatsapp` command)."""


def derive_key(secret: bytes, instance: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=PURPOSE + instance.encode()).derive(secret)


class SessionVault:
    """Encrypted values by name. Not thread-safe; one process uses it at a time (``lock``)."""

    def __init__(self, folder: Path, key: bytes, instance: str) -> None:
        self.folder = Path(folder)
        self.instance = instance
        self._aead = AESGCM(key)
        self._lock_fd: int | None = None
        self._key_checked = False
        self._secure_folder()

    @classmethod
    def open(cls, paths: Paths, instance: str) -> SessionVault:
        """The store of a `[[gateways.whatsapp]]` instance, keyed from this home's session secret."""
        return cls(paths.whatsapp_dir / instance, derive_key(session_secret(paths), instance), instance)

    # ------------------------------------------------------------ values

    def get(self, name: str) -> bytes | None:
        """The value stored under ``name``, None when there is none. Raises SessionError for a file that
        does not decrypt (and says whether the whole store is under another key)."""
        path = self._path(name)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SessionError(f"{path}: cannot read: {exc.strerror}") from None
        return self._open(path, name, blob)

    def put(self, name: str, value: bytes) -> None:
        """Encrypt ``value`` with a fresh nonce and store it; returns once it is durable on disk."""
        self._check_name(name)
        if name != CHECK and not self._key_checked:
            if self._path(CHECK).exists():
                self.get(CHECK)  # never add values under a key the store was not written with
            else:
                self._write(CHECK, CHECK_TEXT)  # the first value of a new store: the key's proof goes first
            self._key_checked = True
        self._write(name, value)

    def delete(self, name: str) -> None:
        path = self._path(name)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.folder)

    def names(self) -> list[str]:
        """Every stored name but the key check, sorted."""
        found = []
        for path in self.folder.iterdir():
            if path.name.endswith(SUFFIX) and not path.name.startswith("."):
                name = unquote(path.name[: -len(SUFFIX)])
                if name != CHECK:
                    found.append(name)
        return sorted(found)

    def clear(self) -> None:
        """Remove every value and the key check: the session is gone (unlink, or a fresh link)."""
        for path in self.folder.iterdir():
            if path.name.endswith(SUFFIX):
                path.unlink(missing_ok=True)
        self._key_checked = False
        fsync_dir(self.folder)

    def verify(self) -> None:
        """Decrypt every value: raises SessionError naming the first file that does not open."""
        self.get(CHECK)
        for name in self.names():
            self.get(name)

    # ------------------------------------------------------------ one user at a time

    def lock(self) -> None:
        """Take the session for this process; SessionBusy names the holder when another has it."""
        if self._lock_fd is not None:
            return
        path = self.folder / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SessionBusy(f"the WhatsApp session of {self.instance!r} is in use by process {holder}"
                              " (the gateway, or another `starling whatsapp` command)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock_fd = fd
        self._remove_leftovers()  # only the holder: another process's write in flight is not a leftover

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    @property
    def locked(self) -> bool:
        return self._lock_fd is not None

    def busy(self) -> bool:
        """True when another process holds the lock (a look, without taking it)."""
        if self._lock_fd is not None:
            return False
        try:
            fd = os.open(self.folder / LOCK_FILE, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)

    # ------------------------------------------------------------ files

    def _path(self, name: str) -> Path:
        self._check_name(name)
        return self.folder / (quote(name, safe="") + SUFFIX)

    @staticmethod
    def _check_name(name: str) -> None:
        if not name or len(name) > 200:
            raise ValueError(f"invalid session value name {name!r}")

    def _aad(self, name: str) -> bytes:
        return b"\0".join((MAGIC, self.instance.encode(), name.encode()))

    def _write(self, name: str, value: bytes) -> None:
        nonce = secrets.token_bytes(NONCE_BYTES)
        blob = MAGIC + nonce + self._aead.encrypt(nonce, bytes(value), self._aad(name))
        try:
            write_private_file(self._path(name), blob)
        except OSError as exc:
            raise StarlingError(f"{self._path(name)}: cannot write the WhatsApp session: {exc.strerror}") from None

    def _open(self, path: Path, name: str, blob: bytes) -> bytes:
        if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + NONCE_BYTES + 16:
            raise SessionError(f"{path}: not a Starling session file (damaged or replaced); refusing to use it."
                               f" Restore it from a backup, or `starling whatsapp unlink {self.instance}` and link again")
        nonce = blob[len(MAGIC): len(MAGIC) + NONCE_BYTES]
        try:
            return self._aead.decrypt(nonce, blob[len(MAGIC) + NONCE_BYTES:], self._aad(name))
        except InvalidTag:
            pass
        if name != CHECK and self._wrong_key():
            raise SessionError(
                f"{path}: the WhatsApp session of {self.instance!r} was encrypted under another session secret"
                " (SESSION_SECRET or data/.session-secret changed?); refusing to use it. Put the old secret back,"
                f" or `starling whatsapp unlink {self.instance}` and link again")
        raise SessionError(
            f"{path}: does not decrypt ({'another session secret, or the file was altered' if name == CHECK else 'the file was altered or damaged'});"
            f" refusing to use it. Restore it, or `starling whatsapp unlink {self.instance}` and link again")

    def _wrong_key(self) -> bool:
        path = self._path(CHECK)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return False
        nonce = blob[len(MAGIC): len(MAGIC) + NONCE_BYTES]
        try:
            self._aead.decrypt(nonce, blob[len(MAGIC) + NONCE_BYTES:], self._aad(CHECK))
            return False
        except (InvalidTag, ValueError):
            return True

    def _secure_folder(self) -> None:
        for folder in (self.folder.parent, self.folder):
            try:
                make_private_dir(folder)
            except OSError as exc:
                raise StarlingError(f"{folder}: cannot create or secure the session folder: {exc.strerror}") from None

    def _remove_leftovers(self) -> None:
        """Temporary files of a write that a crash interrupted: the value they were to replace is intact."""
        for path in self.folder.iterdir():
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)

