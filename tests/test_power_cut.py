"""Power cuts: every write the real writer acked survives a cut at any of 60 random points, and the
database is sound; a writer with synchronous OFF or NORMAL fails the same test (so it can fail)."""

from __future__ import annotations

import asyncio
import bisect
import os
import random
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import apsw
import pytest

from common import db
from common.stores import db_store, keys_store, schema_store, turn_store
from schema import messages as m
from tests import powercut
from tests.procs import REPO, make_home, remove_home

CUTS = 60
INBOUND = 240
WAVE = 20
FINISHED = INBOUND // 4  # turns the runner finishes (updates of existing rows, not only inserts)
SEED = 1313
# frequent checkpoints, PASSIVE and TRUNCATE, so that cuts land inside them too
CONFIG = """
[writer]
checkpoint_interval_s = 0.25
wal_truncate_mb = 0.25
"""


@dataclass
class Run:
    ops: list[powercut.Op]
    inbound: list[tuple[str, int]] = field(default_factory=list)  # (dedupe key, log size when acked)
    finished: list[tuple[int, int]] = field(default_factory=list)  # (turn id, log size when acked)


@dataclass
class Cut:
    index: int
    chaos: bool
    lost_inbound: list[str]
    lost_finished: list[int]
    integrity: list[str]
    schema_version: int
    required: int


def test_acked_writes_survive_a_power_cut_at_60_points_and_the_database_stays_sound():
    run = _record(synchronous=None)
    cuts = [_cut(run, i, at) for i, at in enumerate(_cut_points(run, random.Random(SEED)))]
    bad = [c for c in cuts if c.lost_inbound or c.lost_finished or c.integrity != ["ok"]
           or (c.required and c.schema_version != schema_store.code_version())]
    assert [] == bad, f"seed {SEED}: {bad[:3]}"
    # the cuts did bite: most came after some acks, and both modes of losing unsynced writes ran
    assert sum(1 for c in cuts if c.required) >= CUTS // 2
    assert {True, False} == {c.chaos for c in cuts}
    assert len(run.inbound) == INBOUND and len(run.finished) >= FINISHED


@pytest.mark.parametrize("synchronous", ["OFF", "NORMAL"])
def test_a_writer_that_does_not_sync_each_commit_loses_acked_writes_to_a_power_cut(synchronous):
    run = _record(synchronous=synchronous)
    cuts = [_cut(run, i, at, chaos=False) for i, at in enumerate(_cut_points(run, random.Random(SEED)))]
    assert any(c.lost_inbound or c.lost_finished for c in cuts)


# ---------------------------------------------------------------- recording one run


def _record(synchronous: str | None) -> Run:
    """The real writer (python -m tests.powercut: services.writer.main.main under the recording VFS)
    under a stream of inbound messages and a runner finishing turns; acked = the writer's ack came."""
    home = make_home(CONFIG)
    log = home.root / "ops.log"
    extra = ["--synchronous", synchronous] if synchronous else []
    out = open(home.paths.logs_dir / "writer.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "tests.powercut", str(log), *extra, "--home", str(home.root)],
                            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        run = asyncio.run(asyncio.wait_for(_stream(home, log), 60))
        proc.terminate()
        assert 0 == proc.wait(20)
        run.ops = powercut.read_log(log)
        return run
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        out.close()
        remove_home(home)


async def _stream(home, log: Path) -> Run:
    run = Run(ops=[])
    done = asyncio.Event()
    async with home.client("powercut", timeout_s=1.0, deadline_s=30) as client:
        assert await client.ping(20)

        async def inbound(n: int) -> None:
            key = f"cut:{n}"
            await client.call(m.Inbound(agent="default", instance="test", chat=f"c{n % 9}", sender="u",
                                        text=f"message {n} before the lights went out", dedupe_keys=[key]))
            run.inbound.append((key, log.stat().st_size))

        async def runner() -> None:
            while not done.is_set():
                claim = await client.call(m.ClaimTurn(worker="r1"))
                if not isinstance(claim, m.TurnClaim):
                    await asyncio.sleep(0.01)
                    continue
                await client.call(m.FinishTurn(turn_id=claim.turn_id, worker="r1", answer=f"answer to {claim.text}"))
                run.finished.append((claim.turn_id, log.stat().st_size))

        task = asyncio.create_task(runner())
        for start in range(0, INBOUND, WAVE):
            await asyncio.gather(*(inbound(n) for n in range(start, start + WAVE)))
            await asyncio.sleep(0.03)
        while len(run.finished) < FINISHED and not task.done():  # a busy machine: let the runner catch up
            await asyncio.sleep(0.05)
        done.set()
        await task
    return run


# ---------------------------------------------------------------- cutting it


def _cut_points(run: Run, rng: random.Random) -> list[int]:
    """60 cuts (a cut at k: ops[:k] were issued): a quarter anywhere, a quarter inside checkpoints (writes
    to the main file), a quarter just after a WAL sync (a commit done, its ack maybe not yet sent), and a
    quarter just as an ack came (what it promised must be on the disk by then)."""
    ops = run.ops
    anywhere = range(1, len(ops) + 1)
    checkpoint = [i + 1 for i, op in enumerate(ops) if op.name == "starling.db" and op.kind in "WT"]
    after_sync = [i + 1 for i, op in enumerate(ops) if op.name == "starling.db-wal" and op.kind == "S"]
    ends = [op.end for op in ops]
    at_ack = [k for k in (bisect.bisect_right(ends, pos) for _, pos in run.inbound + run.finished) if k > 0]
    quarter = CUTS // 4
    points = [rng.choice(anywhere) for _ in range(CUTS - 3 * quarter)]
    for pool in (checkpoint, after_sync, at_ack):
        points += [rng.choice(pool or anywhere) for _ in range(quarter)]
    return sorted(points)


def _cut(run: Run, index: int, at: int, chaos: bool | None = None) -> Cut:
    """Rebuild the disk after a cut at ``at``, open it as the writer would at the next boot (the normal
    VFS, WAL recovery), and check every write acked before the cut."""
    chaos = bool(index % 2) if chaos is None else chaos
    files = powercut.survivors(run.ops, at, random.Random(SEED * 1000 + index) if chaos else None)
    upto = run.ops[at - 1].end
    inbound = [key for key, pos in run.inbound if pos <= upto]
    finished = [turn for turn, pos in run.finished if pos <= upto]
    folder = Path(tempfile.mkdtemp(prefix="cut", dir="/tmp"))
    try:
        powercut.materialize(files, folder)
        conn = db.open_writer(folder / "starling.db")
        try:
            integrity = db_store.integrity_check(conn)
            version = schema_store.version(conn)
            lost_inbound, lost_finished = _lost(conn, inbound, finished)
        finally:
            conn.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Cut(index, chaos, lost_inbound, lost_finished, integrity, version, len(inbound) + len(finished))


def _lost(conn: apsw.Connection, inbound: list[str], finished: list[int]) -> tuple[list[str], list[int]]:
    try:
        lost_inbound = [k for k in inbound if keys_store.inbound_turn(conn, [k]) is None]
        lost_finished = [t for t in finished if getattr(turn_store.get(conn, t), "state", None) != "done"]
    except apsw.SQLError:  # no tables at all: the migrations themselves were lost
        return inbound, finished
    return lost_inbound, lost_finished


def test_the_disk_model_keeps_what_a_sync_covered_and_at_most_some_of_the_rest():
    def op(kind, name, offset=0, data=b""):
        return powercut.Op(kind, name, offset, data, 0)

    ops = [op("W", "db-wal", 0, b"one"), op("S", "db-wal"), op("W", "db-wal", 0, b"two"), op("W", "db", 0, b"x")]
    assert {"db-wal": b"one"} == powercut.survivors(ops, 4)  # db never synced: its name is not durable either
    seen = {powercut.survivors(ops, 4, random.Random(seed)).get("db-wal") for seed in range(40)}
    assert {b"one", b"two"} == seen
    page = bytes(range(256)) * 8  # 2048 bytes: four sectors, each kept or lost on its own
    torn = {powercut.survivors([*ops[:2], op("W", "db-wal", 0, page)], 3, random.Random(s))["db-wal"] for s in range(40)}
    assert any(t[:512] == page[:512] and t[512:1024] != page[512:1024] for t in torn)
    unlinked = [*ops[:2], op("D", "db-wal")]
    assert ({"db-wal": b"one"}, {}) == (powercut.survivors(unlinked, 3),
                                         powercut.survivors([*unlinked, op("F", "data")], 4))
