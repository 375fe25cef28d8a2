"""`starling backup create|verify|list|restore`: an archive made while writes go on, verified, restored into a new
home whose writer boots on it with the rows there and a WhatsApp session that still decrypts; tampering, refusals,
retention."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
import threading
from pathlib import Path

import pytest

from common import db
from common.backup import BackupError, verify
from common.cli.main import main
from common.config import default_config_text
from common.secrets import set_secret
from common.stores import turn_store
from schema import messages as m
from services.gateway.whatsapp.session_vault import SessionVault
from tests.procs import make_home, remove_home, start_writer, wait_until

BIG_TEXT = "x" * 8000


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def prefill(home, count: int) -> None:
    """Rows enough (about 12 MB) that the writer's online copy takes several steps."""
    async with home.client("prefill", deadline_s=60) as c:
        for start in range(0, count, 100):
            await asyncio.gather(*(c.call(m.Inbound(
                agent="default", instance="test", chat=f"fill-{n % 10}", sender="u1", text=f"{n} {BIG_TEXT}",
                dedupe_keys=[f"fill:{n}"])) for n in range(start, min(count, start + 100))))


@pytest.fixture(scope="module")
def source():
    """A home with a running writer, about 1,500 turns, a secret, a second agent and a linked WhatsApp session."""
    home = make_home(default_config_text() + '\n[[gateways.whatsapp]]\nid = "phone"\nmode = "linked"\n')
    assert 0 == main(["--home", str(home.root), "init"])
    assert 0 == main(["--home", str(home.root), "agent", "new", "helper"])
    set_secret(home.paths.secrets_file, "openai", "sk-backup-test-value")
    vault = SessionVault.open(home.paths, "phone")
    vault.put("device", b"linked device identity")
    vault.put("contact/15551234567", b"a contact's session")
    proc = start_writer(home)
    asyncio.run(asyncio.wait_for(prefill(home, 1500), 120))
    yield home
    proc.stop()
    remove_home(home)


class Streamer:
    """Inbound writes streamed from a thread of its own (16 in flight) until stopped; ``acked`` in ack order."""

    def __init__(self, home) -> None:
        self.home, self.acked, self.stopping = home, [], threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self.thread.start()

    async def _run(self) -> None:
        async with self.home.client("streamer", deadline_s=30) as c:
            async def lane(lane_id: int) -> None:
                n = 0
                while not self.stopping.is_set():
                    key = f"s{lane_id}:{n}"
                    await c.call(m.Inbound(agent="default", instance="test", chat=f"stream-{lane_id}", sender="u2",
                                           text=f"message {key}", dedupe_keys=[key]))
                    self.acked.append(key)
                    n += 1
            await asyncio.gather(*(lane(i) for i in range(16)))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)


def test_a_backup_made_while_writes_go_on_restores_into_a_new_home_that_starts(capsys, source, tmp_path):
    streamer = Streamer(source)
    try:
        wait_until(lambda: len(streamer.acked) >= 50, timeout=30, what="the first streamed acks")
        before = list(streamer.acked)
        rc, out, err = cli(capsys, "--home", str(source.root), "backup", "create", str(tmp_path), "--verify")
        during = len(streamer.acked) - len(before)
    finally:
        streamer.stop()
    [archive] = tmp_path.glob("starling-*.tar.gz")
    assert (0, True, 0o600, True) == (rc, "verified: every checksum matches, integrity_check ok" in out,
                                      mode(archive), during > 0), (out, err)

    new_root = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    assert 0 == main(["--home", str(new_root), "init"])  # a new host: its own (different) session secret
    capsys.readouterr()
    try:
        rc, out, err = cli(capsys, "backup", "restore", str(archive), "--home", str(new_root))
        assert (0, True) == (rc, "integrity_check ok" in out), (out, err)
        restored = make_home(root=new_root, keep_config=True)
        writer = start_writer(restored)  # the writer boots on the restored database
        try:
            conn = db.open_reader(restored.paths.db_file)
            with db.read_tx(conn):
                total = turn_store.count(conn)
                texts = {t.content for lane in range(16)
                         for t in turn_store.user_turns_for_chat(conn, "test", f"stream-{lane}")}
            conn.close()
        finally:
            writer.stop()
        missing = [key for key in before if f"message {key}" not in texts]
        session = SessionVault.open(restored.paths, "phone")
        assert ([], True, b"linked device identity", b"a contact's session", True, True) == (
            missing, total >= 1500 + len(before), session.get("device"), session.get("contact/15551234567"),
            (new_root / "agents/helper/SOUL.md").is_file(), "sk-backup-test-value" in
            (new_root / "data/secrets.json").read_text())
        assert (0o600, 0o600, 0o700) == (mode(new_root / "data/starling.db"), mode(new_root / "data/.session-secret"),
                                         mode(new_root / "agents/helper"))
    finally:
        shutil.rmtree(new_root, ignore_errors=True)


def archive_of(capsys, source, folder: Path) -> Path:
    rc, out, err = cli(capsys, "--home", str(source.root), "backup", "create", str(folder) + "/", "--json")
    assert 0 == rc, err
    return Path(json.loads(out)["path"])


def rewrite(archive: Path, target: Path, change) -> None:
    """Copy an archive member by member, letting ``change(name, data)`` alter, drop (None) or add members."""
    with tarfile.open(archive, "r:gz") as src, tarfile.open(target, "w:gz") as dst:
        for member in src:
            data = src.extractfile(member).read()
            data = change(member.name, data)
            if data is None:
                continue
            member.size = len(data)
            dst.addfile(member, io.BytesIO(data))


def test_verify_passes_a_sound_archive_and_says_what_it_holds(capsys, source, tmp_path):
    archive = archive_of(capsys, source, tmp_path)
    rc, out, _ = cli(capsys, "backup", "verify", str(archive))
    assert (0, True, True) == (rc, "every checksum matches, integrity_check ok" in out, "2 agents" in out)


def test_verify_detects_a_member_altered_inside_a_well_formed_archive(capsys, source, tmp_path):
    archive = archive_of(capsys, source, tmp_path)
    tampered = tmp_path / "tampered.tar.gz"
    rewrite(archive, tampered, lambda name, data: data.replace(b"sk-backup", b"sk-BACKUP")
            if name == "data/secrets.json" else data)
    rc, _, err = cli(capsys, "backup", "verify", str(tampered))
    assert (1, True) == (rc, "data/secrets.json does not match its checksum" in err), err


def test_verify_detects_a_flipped_byte(capsys, source, tmp_path):
    archive = archive_of(capsys, source, tmp_path)
    raw = bytearray(archive.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    flipped = tmp_path / "flipped.tar.gz"
    flipped.write_bytes(bytes(raw))
    with pytest.raises(BackupError):
        verify(flipped)


@pytest.mark.parametrize("change, words", [
    (lambda name, data: None if name.startswith("agents/helper/") else data, "incomplete"),
    (lambda name, data: data if name != "config.toml" else data + b"\n", "config.toml does not match"),
])
def test_verify_detects_a_missing_or_changed_member(capsys, source, tmp_path, change, words):
    archive = archive_of(capsys, source, tmp_path)
    bad = tmp_path / "bad.tar.gz"
    rewrite(archive, bad, change)
    with pytest.raises(BackupError, match=words):
        verify(bad)


def test_verify_refuses_a_member_the_manifest_does_not_list(capsys, source, tmp_path):
    archive = archive_of(capsys, source, tmp_path)
    bad = tmp_path / "extra.tar.gz"
    with tarfile.open(archive, "r:gz") as src, tarfile.open(bad, "w:gz") as dst:
        for member in src:
            dst.addfile(member, src.extractfile(member))
        extra = tarfile.TarInfo("agents/default/../../evil")
        extra.size = 4
        dst.addfile(extra, io.BytesIO(b"evil"))
    with pytest.raises(BackupError, match="not in the manifest"):
        verify(bad)


def test_a_file_that_is_not_an_archive_is_refused(capsys, tmp_path):
    plain = tmp_path / "plain.tar.gz"
    plain.write_bytes(gzip.compress(b"not a tar file at all" * 100))
    rc, _, err = cli(capsys, "backup", "verify", str(plain))
    assert (1, True) == (rc, str(plain) in err)


def test_restore_refuses_a_running_home(capsys, source, tmp_path):
    archive = archive_of(capsys, source, tmp_path)
    rc, _, err = cli(capsys, "--home", str(source.root), "backup", "restore", str(archive), "--force")
    assert (1, True) == (rc, "a writer is running on its database" in err), err


def test_restore_refuses_a_stopped_home_with_a_database_unless_forced(capsys, source, tmp_path):
    archive = archive_of(capsys, source, tmp_path)
    target = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    try:
        assert 0 == cli(capsys, "backup", "restore", str(archive), "--home", str(target))[0]
        rc, _, err = cli(capsys, "backup", "restore", str(archive), "--home", str(target))
        forced = cli(capsys, "backup", "restore", str(archive), "--home", str(target), "--force")[0]
        assert (1, True, 0) == (rc, "already holds a Starling database" in err, forced), err
    finally:
        shutil.rmtree(target, ignore_errors=True)


def test_a_tampered_archive_restores_nothing(capsys, source, tmp_path):
    archive = archive_of(capsys, source, tmp_path)
    tampered = tmp_path / "tampered.tar.gz"
    rewrite(archive, tampered, lambda name, data: data + b"#" if name == "agents/helper/SOUL.md" else data)
    target = tmp_path / "new-home"
    rc, _, err = cli(capsys, "backup", "restore", str(tampered), "--home", str(target))
    assert (1, True, False, False) == (rc, "does not match its checksum" in err, (target / "config.toml").exists(),
                                       (target / "data").exists())


def test_list_shows_each_archive_newest_first_and_retention_keeps_the_newest(capsys, source, tmp_path):
    config = source.root / "config.toml"
    original = config.read_text()
    config.write_text(original.replace("keep = 7 ", "keep = 2 "))
    try:
        made = [archive_of(capsys, source, tmp_path) for _ in range(3)]
    finally:
        config.write_text(original)
    rc, out, _ = cli(capsys, "--home", str(source.root), "backup", "list", str(tmp_path), "--json")
    listed = [Path(r["path"]) for r in json.loads(out)]
    assert (0, made[:0:-1], False) == (rc, listed, made[0].exists())


def test_the_default_folder_is_data_backups(capsys, source):
    rc, out, _ = cli(capsys, "--home", str(source.root), "backup", "create", "--json")
    path = Path(json.loads(out)["path"])
    listing = cli(capsys, "--home", str(source.root), "backup", "list")[1]
    path.unlink()
    assert (0, source.paths.data_dir / "backups", True) == (rc, path.parent, path.name in listing)


def test_create_without_a_writer_says_to_start_starling(capsys, tmp_path):
    home = make_home()
    try:
        rc, _, err = cli(capsys, "--home", str(home.root), "backup", "create", str(tmp_path))
    finally:
        remove_home(home)
    assert (1, True) == (rc, "starling up" in err)


def test_create_refuses_to_replace_an_existing_file(capsys, source, tmp_path):
    target = tmp_path / "mine.tar.gz"
    target.write_text("keep me")
    rc, _, err = cli(capsys, "--home", str(source.root), "backup", "create", str(target))
    assert (1, "keep me", True) == (rc, target.read_text(), "exists" in err)


def test_restore_moves_files_across_file_systems_when_data_dir_lives_elsewhere(tmp_path):
    """data_dir on another disk (here /dev/shm, a tmpfs): the staged files cannot be renamed there, so they
    are copied beside their place and renamed."""
    from common import backup
    from common.home import paths_for
    from common.stores import schema_store

    elsewhere = Path(tempfile.mkdtemp(prefix="st", dir="/dev/shm"))
    source = make_home(default_config_text().replace('data_dir = "data"', f'data_dir = "{elsewhere}/data"'))
    try:
        assert os.stat(source.paths.data_dir).st_dev != os.stat(source.root).st_dev
        conn = db.open_writer(source.paths.db_file)
        schema_store.migrate(conn, source.paths.db_file)
        conn.close()
        assert 0 == main(["--home", str(source.root), "init"])
        archive = tmp_path / "a.tar.gz"
        backup.write_archive(archive, backup.collect(source.paths, source.paths.db_file), source.root,
                             schema_store.code_version())
        shutil.rmtree(elsewhere / "data")  # the old host's data disk is gone
        target = tmp_path / "new"
        done = backup.restore(archive, target)
        paths = paths_for(target, source.cfg)
        assert ("ok", ["default"], True, 0o600) == (done.integrity, done.agents, paths.db_file.is_file(),
                                                   mode(paths.db_file))
    finally:
        remove_home(source)
        shutil.rmtree(elsewhere, ignore_errors=True)
