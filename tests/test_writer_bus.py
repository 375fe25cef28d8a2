"""The writer through its socket: acks after commit, idempotency, batches, events, maintenance ops."""

from __future__ import annotations

import asyncio
import uuid

import apsw
import pytest

from common import db
from common.errors import WriteRejected
from common.stores import approval_store, db_store, recall_store, turn_store
from schema import messages as m
from tests.procs import Proc, make_home, remove_home, start_writer


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def inbound(chat: str, text: str = "hello", key: str | None = None) -> m.Inbound:
    return m.Inbound(agent="default", instance="test", chat=chat, sender="u1", text=text,
                     dedupe_keys=[key or uuid.uuid4().hex])


def test_an_acked_write_is_readable_at_once(writer_home):
    async def go():
        async with writer_home.client() as c:
            return await c.call(inbound("ack-chat", "visible right after the ack"))

    accepted = run(go())
    conn = db.open_reader(writer_home.paths.db_file)
    assert "visible right after the ack" == turn_store.get(conn, accepted.turn_id).content


def test_a_redelivered_platform_event_is_not_a_second_turn(writer_home):
    async def go():
        async with writer_home.client() as c:
            first = await c.call(inbound("dup-chat", key="tg:main:update:1"))
            again = await c.call(inbound("dup-chat", key="tg:main:update:1"))
            return first, again

    first, again = run(go())
    assert (first.turn_id, False, True) == (again.turn_id, first.duplicate, again.duplicate)


def test_a_replayed_claim_returns_the_first_claim_not_another_turn(writer_home):
    async def go():
        async with writer_home.client() as c:
            await c.call(inbound("replay-a"))
            await c.call(inbound("replay-b"))
            key = c.new_key()
            first = await c.call(m.ClaimTurn(worker="r1"), key=key)
            again = await c.call(m.ClaimTurn(worker="r1"), key=key)
            await c.call(m.FinishTurn(turn_id=first.turn_id, worker="r1"))
            return first, again

    first, again = run(go())
    assert first == again


def test_one_bad_request_gets_an_error_and_does_not_sink_its_batch(writer_home):
    async def go():
        async with writer_home.client() as c:
            ops = [inbound(f"batch-{i}") for i in range(50)]
            ops.insert(25, m.FinishTurn(turn_id=10**9, worker="nobody"))
            return await asyncio.gather(*(c.call(op) for op in ops), return_exceptions=True)

    results = run(go())
    errors = [r for r in results if isinstance(r, Exception)]
    accepted = [r for r in results if isinstance(r, m.Accepted)]
    assert (1, "not_found", 50) == (len(errors), errors[0].code, len(accepted))


def test_a_second_runner_cannot_finish_a_turn_it_does_not_hold(writer_home):
    async def go():
        async with writer_home.client() as c:
            await c.call(inbound("lease-chat"))
            claim = await c.call(m.ClaimTurn(worker="r1"))
            with pytest.raises(WriteRejected) as err:
                await c.call(m.FinishTurn(turn_id=claim.turn_id, worker="r2", answer="not mine"))
            await c.call(m.FinishTurn(turn_id=claim.turn_id, worker="r1", answer="mine",
                                      replies=[m.Reply(text="mine")]))
            return err.value.code

    assert "lease_lost" == run(go())


def test_committed_changes_are_published_with_sequence_numbers(writer_home):
    async def go():
        sub = writer_home.subscriber([m.TOPIC_TURN])
        sub.start()
        try:
            first = await sub.next(5)  # first contact: re-read everything
            async with writer_home.client() as c:
                a = await c.call(inbound("event-chat"))
                b = await c.call(inbound("event-chat"))
            got = []
            while len(got) < 2:
                ev = await sub.next(5)
                assert ev is not None, "no event within 5 s"
                if isinstance(ev, m.TurnPending) and ev.turn_id in (a.turn_id, b.turn_id):
                    got.append(ev)
            return first, got
        finally:
            sub.close()

    first, got = run(go())
    assert "Resync" == type(first).__name__
    assert got[1].seq == got[0].seq + 1


def test_a_writer_restart_tells_subscribers_to_reread(home):
    writer = start_writer(home)

    async def go():
        nonlocal writer
        sub = home.subscriber([m.TOPIC_TURN], beat_timeout_s=3)
        sub.start()
        try:
            assert "Resync" == type(await sub.next(5)).__name__
            writer.kill9()
            writer = start_writer(home)
            while True:
                ev = await sub.next(10)
                assert ev is not None, "no resync within 10 s of the restart"
                if type(ev).__name__ == "Resync":
                    return ev.reason
        finally:
            sub.close()

    try:
        reason = run(go())
        assert reason in ("the writer restarted", "no beat from the writer in 3s")
    finally:
        writer.stop()


def test_backup_taken_during_writes_opens_and_passes_integrity_check(writer_home):
    target = writer_home.root / "backups" / "during-writes.db"

    async def go():
        async with writer_home.client() as c:
            stop = asyncio.Event()

            async def stream():
                n = 0
                while not stop.is_set():
                    await c.call(inbound(f"backup-{n % 5}", f"row {n}"))
                    n += 1
                return n

            streamer = asyncio.create_task(stream())
            await asyncio.sleep(0.2)
            result = await c.call(m.Backup(path=str(target)))
            await asyncio.sleep(0.1)
            stop.set()
            return result, await streamer

    result, written = run(go())
    conn = apsw.Connection(str(target), flags=apsw.SQLITE_OPEN_READONLY)
    assert (str(target), ["ok"], True) == (result.path, db_store.integrity_check(conn), written > 0)
    assert turn_store.count(conn) > 0
    assert 0o600 == target.stat().st_mode & 0o777


def test_fts_finds_stemmed_forms_and_survives_a_rebuild(writer_home):
    async def go():
        async with writer_home.client() as c:
            for text in ("please retry the upload", "two retries so far", "it retried at noon", "unrelated words"):
                await c.call(inbound("fts-chat", text))
            before = _search(writer_home, "retry")
            await c.call(m.FtsRebuild())
            return before, _search(writer_home, "retry")

    before, after = run(go())
    assert 3 == len(before)
    assert before == after


def _search(home, text):
    conn = db.open_reader(home.paths.db_file)
    try:
        with db.read_tx(conn):
            return sorted(hit.content for hit in recall_store.search(conn, text))
    finally:
        conn.close()


def test_checkpoint_truncate_empties_the_wal(writer_home):
    async def go():
        async with writer_home.client() as c:
            await c.call(inbound("ckpt-chat"))
            return await c.call(m.Checkpoint(mode="truncate"))

    result = run(go())
    wal = writer_home.paths.db_file.with_name("starling.db-wal")
    assert (0, 0) == (result.busy, wal.stat().st_size)


def test_a_bad_config_stops_the_writer_with_file_key_and_reason():
    home = make_home()
    try:
        (home.root / "config.toml").write_text("[writer]\nbatch_max = 0\n")
        proc = Proc(home, "writer")
        code = proc.popen.wait(20)
        proc.stop()
        text = proc.log_text()
        assert (1, True, True) == (code, "config.toml" in text, "writer.batch_max" in text)
    finally:
        remove_home(home)


def test_only_the_lease_holder_may_append_to_a_turn(home):
    writer = start_writer(home)  # its own database: claims take the oldest pending turn

    async def go():
        async with home.client() as c:
            accepted = await c.call(inbound("append-chat"))
            claim = await c.call(m.ClaimTurn(worker="holder"))
            assert claim.turn_id == accepted.turn_id
            stranger = m.AppendTurn(session_id=claim.session_id, worker="stranger", role="tool", content="x",
                                    parent_turn_id=claim.turn_id)
            with pytest.raises(WriteRejected) as err:
                await c.call(stranger)
            own = await c.call(m.AppendTurn(session_id=claim.session_id, worker="holder", role="tool", content="y",
                                            parent_turn_id=claim.turn_id))
            await c.call(m.FinishTurn(turn_id=claim.turn_id, worker="holder"))
            return err.value.code, own

    try:
        code, own = run(go())
    finally:
        writer.stop()
    assert ("lease_lost", True) == (code, isinstance(own, m.Stored))


def test_an_endless_retry_delay_is_refused(writer_home):
    async def go():
        async with writer_home.client() as c:
            queued = await c.call(m.EnqueueOutbox(instance="inf", chat="c", replies=[m.Reply(text="hi")]))
            claim = await c.call(m.ClaimOutbox(worker="g", instances=["inf"]))
            with pytest.raises(WriteRejected) as err:
                await c.call(m.OutboxFailed(id=claim.items[0].id, worker="g", error="x", retry_after_s=float("inf")))
            await c.call(m.OutboxFailed(id=claim.items[0].id, worker="g", error="x", retry_after_s=-1))
            return queued, err.value.code

    queued, code = run(go())
    assert "invalid" == code


def test_a_backup_onto_the_live_database_is_refused(writer_home):
    async def go():
        async with writer_home.client() as c:
            with pytest.raises(WriteRejected) as err:
                await c.call(m.Backup(path=str(writer_home.paths.db_file)))
            return err.value

    err = run(go())
    assert ("invalid", True) == (err.code, "live database" in str(err))


def test_a_replayed_fts_rebuild_is_answered_without_running_again(writer_home):
    async def go():
        async with writer_home.client() as c:
            key = c.new_key()
            first = await c.call(m.FtsRebuild(), key=key)
            again = await c.call(m.FtsRebuild(), key=key)
            return first, again

    first, again = run(go())
    log = (writer_home.paths.logs_dir / "writer.log").read_text()
    assert (first, 1) == (again, log.count('"event":"fts_rebuilt"') - _rebuilds_before)


_rebuilds_before = 0


@pytest.fixture(autouse=True)
def _count_rebuilds(writer_home):
    global _rebuilds_before
    log = writer_home.paths.logs_dir / "writer.log"
    _rebuilds_before = log.read_text().count('"event":"fts_rebuilt"') if log.exists() else 0


def test_an_expired_approval_puts_its_turn_back_to_work(home):
    writer = start_writer(home)

    async def go():
        async with home.client() as c:
            accepted = await c.call(inbound("expiry-chat"))
            claim = await c.call(m.ClaimTurn(worker="r1"))
            await c.call(m.ParkTurn(turn_id=claim.turn_id, worker="r1", approval_id="EXPIRE01", tool="shell",
                                    ttl_s=0.2, notice="approve with /approve EXPIRE01"))
            [notice] = (await c.call(m.ClaimOutbox(worker="gw", instances=["test"], chats=["expiry-chat"]))).items
            assert ("approve with /approve EXPIRE01", "EXPIRE01") == (notice.body, notice.approval_id)
            conn = db.open_reader(home.paths.db_file)
            parked = turn_store.get(conn, accepted.turn_id).state
            deadline = asyncio.get_running_loop().time() + 15
            while asyncio.get_running_loop().time() < deadline:  # the writer checks for expired approvals every second
                if turn_store.get(conn, accepted.turn_id).state == "pending":
                    break
                await asyncio.sleep(0.1)
            again = await c.call(m.ClaimTurn(worker="r2"))
            with pytest.raises(WriteRejected) as late:
                await c.call(m.DecideApproval(approval_id="EXPIRE01", approve=True, decided_by="u1"))
            return parked, approval_store.get(conn, "EXPIRE01").state, again.turn_id, claim.turn_id, late.value.code

    try:
        parked, state, again, first, code = run(go())
    finally:
        writer.stop()
    assert ("waiting", "expired", first, "conflict") == (parked, state, again, code)


def test_a_send_during_a_turn_needs_the_turns_lease(home):
    writer = start_writer(home)

    async def go():
        async with home.client() as c:
            await c.call(inbound("send-chat"))
            claim = await c.call(m.ClaimTurn(worker="holder"))
            reply = [m.Reply(text="from a tool")]
            with pytest.raises(WriteRejected) as err:
                await c.call(m.EnqueueOutbox(instance="test", chat="send-chat", replies=reply,
                                             turn_id=claim.turn_id, worker="former-holder"))
            queued = await c.call(m.EnqueueOutbox(instance="test", chat="send-chat", replies=reply,
                                                  turn_id=claim.turn_id, worker="holder"))
            return err.value.code, queued

    try:
        code, queued = run(go())
    finally:
        writer.stop()
    assert ("lease_lost", 1) == (code, len(queued.ids))
