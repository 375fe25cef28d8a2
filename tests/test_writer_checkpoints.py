"""The writer's checkpoint policy (services/writer/maintenance.py) against a real SQLite file: it follows
the frames the WAL holds (the connection's wal_hook), not the WAL file's size, which never shrinks after
a PASSIVE checkpoint."""

from __future__ import annotations

import itertools
import time
import shutil
from pathlib import Path

import pytest

from common import db
from common.stores import db_store, keys_store
from services.writer.maintenance import Maintenance

BOUND_MB = 1  # wal_truncate_mb: a PASSIVE checkpoint every 256 KB of frames, TRUNCATE past 1 MB
ROW_BYTES = 3 * 4096  # each commit writes a few pages
SLACK = 16  # frames: a checkpoint comes after the commit that reached its mark, which writes up to this many


class QuietLog:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def info(self, event: str, **kw) -> None:
        self.lines.append((event, kw))

    warning = error = info


class Recording(Maintenance):
    """Maintenance that notes the mode of every checkpoint it runs."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.calls: list[str] = []

    def checkpoint(self, mode: str):
        self.calls.append(mode)
        return super().checkpoint(mode)


@pytest.fixture
def writer(tmp_path: Path, migrated_file: Path):
    path = tmp_path / "starling.db"
    shutil.copyfile(migrated_file, path)
    conn = db.open_writer(path)
    maint = Recording(conn, path, 3600.0, BOUND_MB, QuietLog())
    yield conn, maint, path
    conn.close()


_keys = itertools.count()


def commit_row(conn) -> None:
    """One commit of a few pages (an answer kept in write_keys, large enough to overflow)."""
    db_store.begin(conn)
    keys_store.remember_answer(conn, f"k{next(_keys)}", bytes(ROW_BYTES), time.time())
    db_store.commit(conn)


def wal_size(path: Path) -> int:
    wal = path.with_name(path.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def test_passive_checkpoints_come_every_quarter_of_the_bound_in_frames(writer):
    conn, maint, path = writer
    frames_seen: list[int] = []  # the WAL's frames after each commit, as the hook said
    passive_at: list[int] = []  # frames committed since the last checkpoint when one ran
    since = 0
    largest = 0
    for _ in range(400):
        commit_row(conn)
        frames_seen.append(maint.wal_pages)
        since = maint.wal_pages - maint.checked_pages
        calls = len(maint.calls)
        maint.after_commit()
        if len(maint.calls) > calls:
            passive_at.append(since)
        largest = max(largest, wal_size(path))
    modes = set(maint.calls)
    # every checkpoint was PASSIVE (no reader held the WAL, so each let it start over), none TRUNCATE
    assert modes == {"PASSIVE"}, maint.calls
    # ... each after a quarter of the bound (64 frames) was committed since the last, never drifting apart
    assert passive_at and all(maint.passive_pages <= n < maint.passive_pages + SLACK for n in passive_at), passive_at
    assert len(passive_at) >= 400 * 4 // (maint.passive_pages + SLACK)
    # the WAL started over after each: it never held much more than a quarter of the bound
    assert max(frames_seen) < maint.passive_pages + SLACK
    assert largest <= (maint.passive_pages + SLACK) * (4096 + 24) + 32


def test_a_reader_holding_the_wal_gets_a_checkpoint_per_quarter_gained_then_truncate(writer):
    conn, maint, path = writer
    conn.set_busy_timeout(20)  # TRUNCATE waits for the reader this long (the writer's own is seconds)
    reader = db.open_reader(path)
    try:
        db_store.begin_read(reader)
        keys_store.answer(reader, "k0")  # a snapshot: the WAL cannot start over
        while maint.wal_pages < maint.truncate_pages + 2 * maint.passive_pages:
            commit_row(conn)
            maint.after_commit()
        # one checkpoint per quarter of the bound gained, not one after every commit once one fell short:
        # PASSIVE up to the bound, then TRUNCATE (which the reader makes fail, busy)
        quarters = maint.wal_pages // maint.passive_pages
        assert maint.calls.count("PASSIVE") == maint.truncate_pages // maint.passive_pages - 1, maint.calls
        assert 1 <= maint.calls.count("TRUNCATE") <= 2 and len(maint.calls) <= quarters, maint.calls
    finally:
        db_store.rollback(reader)
        reader.close()
    tried = len(maint.calls)
    for _ in range(maint.passive_pages):  # the reader is gone: the next TRUNCATE empties the WAL
        commit_row(conn)
        maint.after_commit()
        if len(maint.calls) > tried:
            break
    assert maint.calls[-1] == "TRUNCATE" and maint.wal_pages == 0 and wal_size(path) == 0


def test_the_timer_checkpoints_only_what_is_not_in_the_database_yet(writer):
    conn, maint, _path = writer
    commit_row(conn)
    maint.after_commit()
    assert maint.calls == []  # a few frames: no checkpoint after the commit
    maint.on_timer(maint.next_checkpoint)
    assert maint.calls == ["PASSIVE"]
    maint.on_timer(maint.next_checkpoint)  # nothing committed since: nothing to copy
    assert len(maint.calls) == 1
