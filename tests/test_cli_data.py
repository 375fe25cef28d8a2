"""`starling fts rebuild` through a real writer (backups: tests/test_backup.py)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from common import db
from common.cli.main import main
from common.stores import turn_store
from schema import messages as m


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
