"""Files written atomically survive a power cut: the new file is fsynced before it is renamed (or linked)
into place, and its folder is fsynced after, before the write returns; a new folder's parent is fsynced
too. Checked by recording the real os calls of each writer of such files."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from common import home as home_mod
from common.home import ensure_layout, ensure_token_file, paths_for, write_private_file
from common.personas import create_pack
from common.secrets import remove_secret, set_secret
from services.gateway.whatsapp.session_vault import SessionVault, derive_key
from services.runner.tools import memory
from tests.tool_helpers import make_ctx, no_secrets_from_other_tests  # noqa: F401 (fixture)


class Recorder:
    """The os calls that decide durability, in order: fsync (by the path its fd names), rename, link,
    mkdir, unlink."""

    def __init__(self, monkeypatch) -> None:
        self.events: list[tuple] = []
        for name in ("replace", "rename", "link"):
            self._wrap(monkeypatch, name, lambda src, dst, *a, _n=name, **k: (_n, str(src), str(dst)))
        self._wrap(monkeypatch, "mkdir", lambda path, *a, **k: ("mkdir", str(path)))
        self._wrap(monkeypatch, "unlink", lambda path, *a, **k: ("unlink", str(path)))
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def _wrap(self, monkeypatch, name: str, describe) -> None:
        real = getattr(os, name)

        def call(*args, **kwargs):
            result = real(*args, **kwargs)
            self.events.append(describe(*args, **kwargs))
            return result

        monkeypatch.setattr(os, name, call)

    def fsyncs(self) -> list[str]:
        return [e[1] for e in self.events if e[0] == "fsync"]

    def assert_durable(self, path: Path) -> None:
        """``path`` was put in place by a rename or link of a file fsynced before, then its folder fsynced."""
        path = str(path)
        moves = [i for i, e in enumerate(self.events) if e[0] in ("replace", "rename", "link") and e[2] == path]
        assert moves, f"{path} was not renamed or linked into place: {self.events}"
        at = moves[-1]
        source = self.events[at][1]
        assert ("fsync", source) in self.events[:at], f"{source} was not fsynced before it became {path}"
        assert ("fsync", str(Path(path).parent)) in self.events[at:], f"{Path(path).parent} not fsynced after {path}"

    def assert_folders_durable(self) -> None:
        """Every folder made was followed by an fsync of its parent."""
        for i, event in enumerate(self.events):
            if event[0] == "mkdir":
                parent = str(Path(event[1]).parent)
                assert ("fsync", parent) in self.events[i:], f"{event[1]} made, {parent} never fsynced after"

    def assert_unlink_durable(self, path: Path) -> None:
        at = self.events.index(("unlink", str(path)))
        assert ("fsync", str(path.parent)) in self.events[at:], f"{path} removed, its folder not fsynced after"


@pytest.fixture
def rec(monkeypatch) -> Recorder:
    return Recorder(monkeypatch)


def test_write_private_file_fsyncs_the_file_then_its_folder(tmp_path, rec):
    write_private_file(tmp_path / "f.json", b"{}")
    rec.assert_durable(tmp_path / "f.json")


def test_a_token_file_is_linked_into_place_durably(tmp_path, rec):
    ensure_token_file(tmp_path / ".control-token")
    rec.assert_durable(tmp_path / ".control-token")


def test_secrets_json_is_replaced_durably_on_set_and_on_remove(home, rec):
    set_secret(home.paths.secrets_file, "telegram-main", "123:abc")
    rec.assert_durable(home.paths.secrets_file)
    rec.events.clear()
    assert remove_secret(home.paths.secrets_file, "telegram-main")
    rec.assert_durable(home.paths.secrets_file)


def test_the_whatsapp_session_vault_is_durable_from_a_new_folder_to_a_removed_value(tmp_path, rec):
    vault = SessionVault(tmp_path / "whatsapp" / "phone", derive_key(b"s" * 32, "phone"), "phone")
    vault.put("session", b"noise keys")
    rec.assert_folders_durable()
    rec.assert_durable(vault._path("check"))
    rec.assert_durable(vault._path("session"))
    vault.delete("session")
    rec.assert_unlink_durable(vault._path("session"))


def test_a_memory_edit_keeps_a_durable_backup_before_the_new_text_replaces_the_file(home, rec):
    ctx = make_ctx(home)
    path = home.paths.agents_dir / "alice" / "MEMORY.md"
    rec.events.clear()
    asyncio.run(memory.memory_edit(ctx, {"file": "MEMORY", "mode": "append", "text": "- likes tea"}))
    [backup] = list((home.paths.backups_dir / "alice").iterdir())
    rec.assert_folders_durable()  # backups/agents/alice/ is new
    rec.assert_durable(backup)
    rec.assert_durable(path)
    backup_done = rec.events.index(("fsync", str(backup.parent)))
    replaced = max(i for i, e in enumerate(rec.events) if e[0] == "replace" and e[2] == str(path))
    assert backup_done < replaced


def test_a_new_persona_pack_and_the_layout_are_durable(tmp_path, rec):
    from common.config import default_config_text, load_config

    (tmp_path / "config.toml").write_text(default_config_text())
    paths = paths_for(tmp_path, load_config(tmp_path / "config.toml"))
    ensure_layout(paths)
    create_pack(paths, "carol")
    rec.assert_folders_durable()
    rec.assert_durable(paths.agents_dir / "carol")


def test_the_recorder_catches_a_write_that_skips_the_folder_fsync(tmp_path, rec, monkeypatch):
    monkeypatch.setattr(home_mod, "fsync_dir", lambda folder: None)
    write_private_file(tmp_path / "f.json", b"{}")
    with pytest.raises(AssertionError, match="not fsynced after"):
        rec.assert_durable(tmp_path / "f.json")
