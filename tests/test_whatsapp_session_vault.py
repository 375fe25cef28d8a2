"""The linked device's session at rest (services/gateway/whatsapp/session_vault.py, working_copy.py):
AES-256-GCM per value, refused when altered or under another key, atomic and durable writes, modes."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from common.errors import StarlingError
from services.gateway.whatsapp.session_vault import (
    MAGIC, NONCE_BYTES, SessionBusy, SessionError, SessionVault, derive_key,
)
from services.gateway.whatsapp.working_copy import DB_KEY, HEADER, WorkingCopy

REPO = Path(__file__).resolve().parent.parent


def store(tmp_path: Path, secret: bytes = b"secret-one", instance: str = "wa") -> SessionVault:
    return SessionVault(tmp_path / "whatsapp" / instance, derive_key(secret, instance), instance)


def test_a_value_comes_back_as_it_was_put(tmp_path):
    s = store(tmp_path)
    s.put("identity", b"\x00\x01 keys")
    s.put("session:4915112345678:0", b"x" * 10_000)
    again = store(tmp_path)
    assert b"\x00\x01 keys" == again.get("identity")
    assert b"x" * 10_000 == again.get("session:4915112345678:0")
    assert ["identity", "session:4915112345678:0"] == again.names()
    assert again.get("missing") is None


def test_nothing_is_stored_in_the_clear(tmp_path):
    s = store(tmp_path)
    s.put("identity", b"PLAINTEXT-KEY-MATERIAL")
    for path in s.folder.iterdir():
        assert b"PLAINTEXT-KEY-MATERIAL" not in path.read_bytes()


def test_each_write_has_a_fresh_nonce(tmp_path):
    s = store(tmp_path)
    path = s.folder / "identity.enc"
    s.put("identity", b"same")
    first = path.read_bytes()
    s.put("identity", b"same")
    second = path.read_bytes()
    assert first[len(MAGIC):len(MAGIC) + NONCE_BYTES] != second[len(MAGIC):len(MAGIC) + NONCE_BYTES]
    assert first != second


def test_a_flipped_byte_is_refused_naming_the_file(tmp_path):
    s = store(tmp_path)
    s.put("identity", b"keys")
    path = s.folder / "identity.enc"
    blob = bytearray(path.read_bytes())
    blob[-5] ^= 0x01
    path.write_bytes(bytes(blob))
    with pytest.raises(SessionError) as err:
        store(tmp_path).get("identity")
    assert str(path) in str(err.value) and "altered" in str(err.value)
    assert bytes(blob) == path.read_bytes()  # refused, never replaced


def test_a_file_moved_over_another_is_refused(tmp_path):
    s = store(tmp_path)
    s.put("session:a", b"alice's session")
    s.put("session:b", b"bob's session")
    (s.folder / "session%3Ab.enc").write_bytes((s.folder / "session%3Aa.enc").read_bytes())
    with pytest.raises(SessionError):
        s.get("session:b")


def test_another_session_secret_is_refused_and_named(tmp_path):
    store(tmp_path, b"secret-one").put("identity", b"keys")
    other = store(tmp_path, b"secret-two")
    with pytest.raises(SessionError) as err:
        other.get("identity")
    assert "another session secret" in str(err.value)
    with pytest.raises(SessionError):
        other.put("more", b"never mixed with the old key")
    assert b"keys" == store(tmp_path, b"secret-one").get("identity")


def test_the_key_comes_from_the_homes_session_secret(tmp_path, monkeypatch):
    from tests.procs import make_home, remove_home

    (tmp_path / "home").mkdir()
    home = make_home("", root=tmp_path / "home")
    try:
        monkeypatch.delenv("SESSION_SECRET", raising=False)
        SessionVault.open(home.paths, "wa").put("identity", b"keys")
        assert b"keys" == SessionVault.open(home.paths, "wa").get("identity")
        monkeypatch.setenv("SESSION_SECRET", "a-different-secret")
        with pytest.raises(SessionError):
            SessionVault.open(home.paths, "wa").get("identity")
    finally:
        remove_home(home)


def test_files_are_0600_and_folders_0700(tmp_path):
    os.umask(0o022)
    s = store(tmp_path)
    s.put("identity", b"keys")
    assert 0o700 == stat.S_IMODE(s.folder.stat().st_mode)
    assert 0o700 == stat.S_IMODE(s.folder.parent.stat().st_mode)
    assert all(0o600 == stat.S_IMODE(p.stat().st_mode) for p in s.folder.glob("*.enc"))


def test_a_leftover_temporary_file_leaves_the_last_good_value(tmp_path):
    s = store(tmp_path)
    s.put("identity", b"good")
    leftover = s.folder / ".identity.enc.0123456789ab.tmp"
    leftover.write_bytes(b"half a wri")  # a crash between write and rename
    again = store(tmp_path)
    assert b"good" == again.get("identity")
    again.lock()
    assert not leftover.exists()  # the holder of the session clears it up
    again.unlock()


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from services.gateway.whatsapp.session_vault import SessionVault, derive_key
    s = SessionVault(Path(sys.argv[1]), derive_key(b"k", "wa"), "wa")
    n = 0
    while True:
        n += 1
        s.put("ratchet", (str(n) + ":").encode() * 2000)
        if n == 1:
            print("started", flush=True)
""")


def test_killing_a_writer_mid_stream_leaves_a_readable_value(tmp_path):
    folder = tmp_path / "whatsapp" / "wa"
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(folder)], cwd=REPO, stdout=subprocess.PIPE)
        try:
            assert b"started" in proc.stdout.readline()
            time.sleep(0.15)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        value = SessionVault(folder, derive_key(b"k", "wa"), "wa").get("ratchet")
        n = value.split(b":")[0]
        assert value == (n + b":") * 2000  # one whole version, never a mix


def test_one_process_holds_the_session_at_a_time(tmp_path):
    s = store(tmp_path)
    s.lock()
    holder = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from pathlib import Path
        from services.gateway.whatsapp.session_vault import SessionVault, SessionBusy, derive_key
        s = SessionVault(Path({str(s.folder)!r}), derive_key(b"secret-one", "wa"), "wa")
        assert s.busy()
        try:
            s.lock()
        except SessionBusy as exc:
            print(exc)
    """)], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert f"in use by process {os.getpid()}" in holder.stdout, holder.stderr
    s.unlock()
    other = store(tmp_path)
    other.lock()  # free again
    other.unlock()
    assert issubclass(SessionBusy, StarlingError)


def test_clear_removes_the_session(tmp_path):
    s = store(tmp_path)
    s.put("identity", b"keys")
    s.clear()
    assert [] == s.names() and not list(s.folder.glob("*.enc"))
    store(tmp_path, b"another secret").put("identity", b"a new link may use a new key")


# ---------------------------------------------------------------- the working copy (neonize's database)


def fake_db(pages: int, fill: int) -> bytes:
    """A database image as SQLite lays one out: the header says page size and count, the length agrees."""
    page = 4096
    head = bytearray(HEADER + bytes(100 - len(HEADER)))
    head[16:18] = page.to_bytes(2, "big")
    head[24:28] = head[92:96] = (7).to_bytes(4, "big")
    head[28:32] = pages.to_bytes(4, "big")
    return bytes(head) + bytes([fill]) * (page * pages - 100)


def test_the_working_copy_is_saved_encrypted_and_restored(tmp_path):
    s = store(tmp_path)
    copy = WorkingCopy(s, tmp_path / "shm" / "work")
    assert not copy.restore()  # nothing linked yet
    assert 0o700 == stat.S_IMODE(copy.folder.stat().st_mode)
    copy.db.write_bytes(fake_db(3, 1))
    assert copy.save()
    assert not copy.save()  # unchanged: not written again
    assert fake_db(3, 1) not in (s.folder / f"{DB_KEY}.enc").read_bytes()
    copy.wipe()
    assert not copy.folder.exists()
    again = WorkingCopy(s, tmp_path / "shm" / "work")
    assert again.restore()
    assert fake_db(3, 1) == again.db.read_bytes()
    assert 0o600 == stat.S_IMODE(again.db.stat().st_mode)


def test_a_write_in_progress_is_not_copied(tmp_path):
    s = store(tmp_path)
    copy = WorkingCopy(s, tmp_path / "work")
    copy.restore()
    copy.db.write_bytes(fake_db(2, 1))
    assert copy.save()
    copy.db.write_bytes(fake_db(3, 2))
    journal = copy.db.with_name(copy.db.name + "-journal")
    journal.write_bytes(b"rollback journal")  # SQLite is inside a write transaction
    assert not copy.save()
    journal.unlink()
    copy.db.write_bytes(fake_db(3, 2)[:5000])  # torn: the header promises more pages than there are
    assert not copy.save()
    copy.db.write_bytes(fake_db(3, 2))
    assert copy.save()
    fresh = WorkingCopy(s, tmp_path / "work2")
    fresh.restore()
    assert fake_db(3, 2) == fresh.db.read_bytes()
