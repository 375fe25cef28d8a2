"""`starling backup` and `starling fts rebuild` through a real writer; a clear error without one."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import apsw
import pytest

from common import db
from common.cli.main import main
from common.stores import db_store, turn_store
from schema import messages as m
from tests.procs import make_home, remove_home


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def with_turns(writer_home):
    async def fill() -> None:
        async with writer_home.client() as c:
            for i in range(5):
                await c.call(m.Inbound(agent="default", instance="test", chat="backup", sender="u1",
                                       text=f"message number {i}", dedupe_keys=[uuid.uuid4().hex]))

    asyncio.run(asyncio.wait_for(fill(), 30))
    return writer_home


def test_backup_writes_a_copy_that_passes_integrity_check(capsys, with_turns, tmp_path):
    target = tmp_path / "copy.db"
    rc, out, _ = cli(capsys, "--home", str(with_turns.root), "backup", str(target))
    conn = apsw.Connection(str(target), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        result = (rc, db_store.integrity_check(conn), turn_store.count(conn) >= 5)
    finally:
        conn.close()
    assert (0, ["ok"], True) == result


def test_backup_prints_path_size_and_seconds(capsys, with_turns, tmp_path):
    target = tmp_path / "copy.db"
    _, out, _ = cli(capsys, "--home", str(with_turns.root), "backup", str(target))
    lines = out.splitlines()
    assert (f"backup written: {target}", True, True) == (lines[0], " KB" in lines[1], lines[1].endswith(" s"))


def test_backup_defaults_to_a_dated_file_under_data_backups(capsys, with_turns):
    _, out, _ = cli(capsys, "--home", str(with_turns.root), "backup", "--json")
    path = Path(json.loads(out)["path"])
    assert (with_turns.paths.data_dir / "backups", True, True) == (
        path.parent, path.name.startswith("starling-") and path.suffix == ".db", path.is_file())


def test_backup_refuses_to_overwrite_without_force(capsys, with_turns, tmp_path):
    target = tmp_path / "copy.db"
    target.write_text("keep me")
    rc, _, err = cli(capsys, "--home", str(with_turns.root), "backup", str(target))
    assert (1, "keep me", True) == (rc, target.read_text(), "--force" in err)


def test_backup_without_a_writer_says_to_start_starling(capsys, tmp_path):
    home = make_home()
    try:
        rc, _, err = cli(capsys, "--home", str(home.root), "backup", str(tmp_path / "copy.db"))
    finally:
        remove_home(home)
    assert (1, True) == (rc, "starling up" in err)


def test_fts_rebuild_reports_the_indexed_turns(capsys, with_turns):
    rc, out, _ = cli(capsys, "--home", str(with_turns.root), "fts", "rebuild", "--json")
    reader = db.open_reader(with_turns.paths.db_file)
    try:
        turns = turn_store.count(reader)
    finally:
        reader.close()
    report = json.loads(out)
    assert (0, turns, True) == (rc, report["indexed_turns"], report["complete"])


def test_fts_rebuild_prints_a_count_for_people(capsys, with_turns):
    _, out, _ = cli(capsys, "--home", str(with_turns.root), "fts", "rebuild")
    assert out.startswith("recall index rebuilt: ") and " turns indexed in " in out
