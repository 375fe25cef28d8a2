"""The writer: the one read-write SQLite connection, applying bus write requests in group commits.

Loop: wait for requests (bounded poll), drain up to ``batch_max``, apply them in one transaction
(services/writer/group_commit.py: one failure does not sink the batch), commit, then ack each and publish
the committed changes. Maintenance (checkpoints, backup steps, pruning) runs between batches.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
import uuid
from pathlib import Path

import apsw
import msgspec
import zmq

from common import bus, daemon_log, db, lean
from common.errors import StarlingError
from common.service import Service, boot, notify_systemd, watchdog_interval_s
from common.stores import db_store, schema_store
from schema import messages as m
from services.writer import apply as ops
from services.writer import disk
from services.writer import group_commit
from services.writer import lease_clock
from services.writer import relay
from services.writer import startup
from services.writer.maintenance import Maintenance

POLL_MAX_MS = 200
APPROVAL_EXPIRY_EVERY_S = 1.0
MAINTENANCE_ANSWERS_KEPT = 256
_NOBLOCK = int(zmq.NOBLOCK)  # plain ints: pyzmq's flag enums cost microseconds per send
_SNDMORE_NOBLOCK = int(zmq.SNDMORE | zmq.NOBLOCK)


class _RequestId(msgspec.Struct):
    """Only a request's id, to answer one that failed validation (the other fields are skipped)."""

    id: m.Int


class _EncodedRequests(msgspec.Struct, tag="Requests"):
    """A Requests frame with each request left encoded: when the frame fails validation, each is
    decoded alone, so only the bad ones are refused."""

    requests: list[msgspec.Raw]


_id_decoder = msgspec.msgpack.Decoder(_RequestId)
_one_decoder = msgspec.msgpack.Decoder(m.Request)
_apart_decoder = msgspec.msgpack.Decoder(_EncodedRequests)


class Writer:
    def __init__(self, svc: Service, conn: apsw.Connection, clock: lease_clock.LeaseClock | None = None) -> None:
        self.svc = svc
        self.log = svc.log
        self.conn = conn
        self.signer = bus.Signer(svc.key)
        self.batch_max = svc.cfg.writer.batch_max
        self.epoch = uuid.uuid4().hex[:16]
        self.seqs: dict[str, int] = {}
        self._drop = bus.Drops(svc.log)  # frames dropped, by reason: counted, logged sparsely
        self.schema_version = schema_store.version(conn)
        # leases are judged on the lease clock, and every commit's now is stamped by it (lease_clock.py)
        self.clock = clock or lease_clock.LeaseClock.boot(conn, log=svc.log, alert_to=svc.cfg.health.alert_to)
        lease_clock.install(self.clock)
        self.maint = Maintenance(conn, svc.paths.db_file, svc.cfg.writer.checkpoint_interval_s,
                                 svc.cfg.writer.wal_truncate_mb, svc.log)
        self.reserve = disk.Reserve(svc.paths.data_dir, svc.cfg.writer.reserve_mb, svc.log)
        self.reserve.setup()
        self.maint.on_disk_full = self.reserve.disk_full
        self.maint.hold_pruning = lambda: self.reserve.full
        self.beat_s = svc.cfg.bus.heartbeat_ivl_ms / 1000
        self.next_beat = 0.0
        self.service_beat_s = svc.cfg.health.heartbeat_interval_ms / 1000
        self.next_service_beat = 0.0
        self.beat_full = False  # whether the last service beat said the disk is full
        self.next_expiry = 0.0
        self.watchdog_s = watchdog_interval_s()
        self.next_watchdog = 0.0
        ctx = zmq.Context.instance()
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        bus.tune(self.router, svc.cfg.bus.heartbeat_ivl_ms)
        self.pub = ctx.socket(zmq.PUB)
        bus.limit(self.pub)
        self.pub.setsockopt(zmq.LINGER, bus.LINGER_MS)  # no ZMTP heartbeats on PUB/SUB: see EventSubscriber
        self.pub.setsockopt(zmq.SNDHWM, 100_000)
        for sock, endpoint in ((self.router, svc.endpoints.writer), (self.pub, svc.endpoints.events)):
            _unlink_stale_ipc(endpoint)
            sock.bind(endpoint)
        self.poller = zmq.Poller()
        self.poller.register(self.router, zmq.POLLIN)
        self.backup_waiters: list[tuple[bytes, int, str]] = []  # (client, request id, key)
        self.carry: list[tuple[bytes, m.Request]] = []  # requests received past batch_max, for the next batch
        self.maintenance_answers: dict[str, m.Result] = {}
        self.own_log = daemon_log.Local(svc.name, self.epoch)  # its warnings and errors, into daemon_log
        self.relay = relay.Relay(self.pub, self.signer, self.epoch)  # streaming drafts: relayed, not written

    # ------------------------------------------------------------ receiving

    def _decode(self, frames: list[bytes]) -> list[tuple[bytes, m.Request]]:
        """The requests of one frame (a Request, or the several of a Requests), in order."""
        if len(frames) != 3:
            self._drop("malformed", parts=len(frames))
            return []
        ident, tag, payload = frames
        if len(tag) != bus.MAC_BYTES or not self.signer.verify(tag, payload):
            self._drop("unauthenticated", size=len(payload))
            return []
        try:
            frame = bus.decode(bus.request_decoder, payload)
        except bus.BadFrame as exc:
            if exc.reason == "invalid":
                return self._decode_apart(ident, payload, exc.error)
            self._drop(exc.reason, error=exc.error, size=len(payload))
            return []
        if isinstance(frame, m.Requests):
            return [(ident, req) for req in frame.requests]
        if isinstance(frame, m.ShowDraft):  # a hint: published now, never committed nor acked (relay.py)
            self.relay.show(frame)
            return []
        return [(ident, frame)]

    def _decode_apart(self, ident: bytes, payload: bytes, error: str) -> list[tuple[bytes, m.Request]]:
        """A frame that failed validation: a Requests frame's valid requests are kept and each bad
        one refused; anything else is refused as one request."""
        try:
            parts = [bytes(raw) for raw in bus.decode(_apart_decoder, payload).requests]
        except bus.BadFrame:
            parts = None
        if parts is None:
            self._drop("invalid", error=error, size=len(payload))
            self._refuse_invalid(ident, payload, error)
            return []
        found = []
        for part in parts:
            try:
                found.append((ident, bus.decode(_one_decoder, part)))
            except bus.BadFrame as exc:
                self._drop(exc.reason, error=exc.error, size=len(part))
                if exc.reason == "invalid":
                    self._refuse_invalid(ident, part, exc.error)
        return found

    def _refuse_invalid(self, ident: bytes, payload: bytes, error: str) -> None:
        """An authenticated request that fails validation gets an error ack when its id can be read,
        so its sender fails at once instead of resending it until its deadline. Only the id is
        decoded (the rest is skipped, not built), and whatever the bytes, this never raises."""
        try:
            request_id = bus.decode(_id_decoder, payload).id
        except bus.BadFrame:
            return
        self._send_ack(ident, m.Ack(id=request_id, ok=False, code="invalid", error=error))

    def _drain(self, limit: int = 0) -> list[tuple[bytes, m.Request]]:
        """Up to ``limit`` (``batch_max``) requests: those left over from the last frame first, then
        what arrived."""
        limit = limit or self.batch_max
        batch, self.carry = self.carry, []
        recv = self.router.recv_multipart
        while len(batch) < limit:
            try:
                frames = recv(_NOBLOCK)
            except zmq.Again:
                break
            batch += self._decode(frames)
        if len(batch) > limit:  # a frame's tail waits for the next commit
            batch, self.carry = batch[:limit], batch[limit:]
        return batch

    # ------------------------------------------------------------ sending

    def _send_ack(self, ident: bytes, ack: m.Ack) -> None:
        if ident:  # the writer's own requests (its heartbeat) have no one to ack
            self._send_bundle(ident, [ack])

    def _send_acks(self, acks: list[tuple[bytes, m.Ack]]) -> None:
        """One frame per client per group commit: far fewer sends and wake-ups than one per ack."""
        by_client: dict[bytes, list[m.Ack]] = {}
        for ident, ack in acks:
            if ident:
                by_client.setdefault(ident, []).append(ack)
        for ident, bundle in by_client.items():
            self._send_bundle(ident, bundle)

    def _send_bundle(self, ident: bytes, bundle: list[m.Ack]) -> None:
        """Acks in frames the client can read: a bundle over the bus's frame limit is halved; one ack
        alone over it (a result too large to carry) becomes an error ack that says so."""
        payload = bus.encode(bundle[0] if len(bundle) == 1 else m.Acks(acks=bundle))
        if len(payload) <= bus.MAX_FRAME_BYTES:
            self._send_raw(ident, payload)
        elif len(bundle) > 1:
            half = len(bundle) // 2
            self._send_bundle(ident, bundle[:half])
            self._send_bundle(ident, bundle[half:])
        else:
            self._drop("ack_too_large", size=len(payload))
            error = f"the answer is {len(payload)} bytes, over the bus's {bus.MAX_FRAME_BYTES}"
            self._send_raw(ident, bus.encode(m.Ack(id=bundle[0].id, ok=False, code="too_large", error=error)))

    def _send_raw(self, ident: bytes, payload: bytes) -> None:
        router = self.router
        try:
            router.send(ident, _SNDMORE_NOBLOCK)
            router.send(self.signer.mac(payload), _SNDMORE_NOBLOCK)
            router.send(payload, _NOBLOCK)
        except zmq.ZMQError as exc:  # the client went away (ROUTER_MANDATORY) or its queue is full
            self._drop("ack_undeliverable", error=exc.strerror)

    def _publish(self, topic: str, cls: type, fields: dict) -> None:
        seq = self.seqs.get(topic, 0) + 1
        self.seqs[topic] = seq
        payload = bus.encode(cls(epoch=self.epoch, seq=seq, **fields))
        raw_topic = topic.encode()
        # PUB never blocks: a slow subscriber loses events past its HWM, sees the gap and re-reads
        self.pub.send(raw_topic, _SNDMORE_NOBLOCK)
        self.pub.send(self.signer.mac(payload, raw_topic), _SNDMORE_NOBLOCK)
        self.pub.send(payload, _NOBLOCK)

    # ------------------------------------------------------------ applying

    def _commit_batch(self, batch: list[tuple[bytes, m.Request]]) -> None:
        later: list[tuple[bytes, m.Request]] = []  # maintenance: run on its own after the commit

        def transactional(items: list[tuple[bytes, m.Request]]) -> list[tuple[bytes, m.Request]]:
            work = [item for item in items if not isinstance(item[1].op, ops.MAINTENANCE)]
            if len(work) < len(items):
                later.extend(item for item in items if isinstance(item[1].op, ops.MAINTENANCE))
            return self._held_back(work) if self.reserve.full else work

        work = transactional(batch)
        try:
            applied = group_commit.commit(self.conn, work, self.clock.stamp(), self.log,
                                          lambda room: transactional(self._drain(room)), self.batch_max)
        except apsw.Error as exc:
            code = disk.code_for(exc)  # disk_full, io_error, busy: the clients wait it out and send again
            if code == "disk_full":
                self.reserve.disk_full(str(exc))
            self.log.error("commit_failed", code=code, error=str(exc), batch=len(work) + len(later))
            failed = m.Ack(id=0, ok=False, code=code, error=f"commit failed: {exc}")
            for ident, req in work + later:
                self._send_ack(ident, msgspec.structs.replace(failed, id=req.id))
            return
        self._send_acks(applied.acks)
        for topic, cls, fields in _hints(applied.events):
            self._publish(topic, cls, fields)
        self.maint.after_commit()
        for ident, req in later:
            self._maintenance(ident, req)

    def _held_back(self, work: list[tuple[bytes, m.Request]]) -> list[tuple[bytes, m.Request]]:
        """While the disk is full: what the reserve admits, the rest answered disk_full untried."""
        admitted = []
        for ident, req in work:
            if self.reserve.admits(req.op):
                admitted.append((ident, req))
            else:
                self._send_ack(ident, m.Ack(id=req.id, ok=False, code="disk_full", error=self.reserve.refusal()))
        return admitted

    def _maintenance(self, ident: bytes, req: m.Request) -> None:
        """Checkpoint, FTS rebuild, backup: long and not transactional, so a resend of one that ran is
        answered from memory instead of running it again (the ack of the first may still be in flight)."""
        op = req.op
        done = self.maintenance_answers.get(req.key)
        if done is not None:
            self._send_ack(ident, m.Ack(id=req.id, ok=True, result=done))
            return
        try:
            match op:
                case m.Checkpoint():
                    busy, log_pages, done = self.maint.checkpoint(op.mode)
                    result = m.Checkpointed(busy=busy, wal_pages=log_pages, checkpointed_pages=done)
                case m.FtsRebuild():
                    started = time.monotonic()
                    self.maint.rebuild_fts()
                    self.log.info("fts_rebuilt", seconds=round(time.monotonic() - started, 3))
                    result = m.Done()
                case m.Backup():
                    self.maint.start_backup(Path(op.path))
                    self.backup_waiters.append((ident, req.id, req.key))
                    return
        except ValueError as exc:
            self._send_ack(ident, m.Ack(id=req.id, ok=False, code="invalid", error=str(exc)))
            return
        except (apsw.Error, OSError) as exc:
            self._send_ack(ident, m.Ack(id=req.id, ok=False, code=disk.code_for(exc), error=str(exc)))
            return
        self._remember_maintenance(req.key, result)
        self._send_ack(ident, m.Ack(id=req.id, ok=True, result=result))

    def _remember_maintenance(self, key: str, result: m.Result) -> None:
        self.maintenance_answers[key] = result
        while len(self.maintenance_answers) > MAINTENANCE_ANSWERS_KEPT:
            self.maintenance_answers.pop(next(iter(self.maintenance_answers)))

    def _step_backup(self) -> None:
        try:
            job = self.maint.step_backup()
        except (apsw.Error, OSError) as exc:
            self.maint.abort_backup()
            self.log.error("backup_failed", error=str(exc))
            for ident, request_id, _key in self.backup_waiters:
                self._send_ack(ident, m.Ack(id=request_id, ok=False, code="internal", error=str(exc)))
            self.backup_waiters = []
            return
        if job is None:
            return
        seconds = time.monotonic() - job.started
        self.log.info("backup_done", path=str(job.target), pages=job.pages, seconds=round(seconds, 3))
        result = m.BackedUp(path=str(job.target), pages=job.pages, seconds=seconds)
        for ident, request_id, key in self.backup_waiters:
            self._remember_maintenance(key, result)
            self._send_ack(ident, m.Ack(id=request_id, ok=True, result=result))
        self.backup_waiters = []

    # ------------------------------------------------------------ the loop

    def _beat(self, now_mono: float) -> None:
        if now_mono >= self.next_beat:  # on the bus, for subscribers (lost events, liveness)
            self.next_beat = now_mono + self.beat_s
            self._publish(m.TOPIC_BEAT, m.WriterBeat, {"schema_version": self.schema_version, "seqs": dict(self.seqs)})
        full = self.reserve.full  # `status` and /health say so at once (the beat commits in the reserve)
        if now_mono >= self.next_service_beat or full != self.beat_full:  # in service_beats, for `status`, `/health`
            self.next_service_beat = now_mono + self.service_beat_s
            self.beat_full = full
            beat = m.Heartbeat(service=self.svc.name, pid=os.getpid(), parent_pid=os.getppid(),
                               state="disk_full" if full else "ready", detail=self.reserve.describe() if full else "")
            self._commit_batch([(b"", m.Request(id=0, key="", op=beat))])
        if self.watchdog_s and now_mono >= self.next_watchdog:
            self.next_watchdog = now_mono + self.watchdog_s
            notify_systemd("WATCHDOG=1")

    def _expire_approvals(self, now_mono: float) -> None:
        if now_mono < self.next_expiry or self.reserve.full:  # expiry waits for room on the disk
            return
        self.next_expiry = now_mono + APPROVAL_EXPIRY_EVERY_S
        events: list[ops.Pending] = []
        db_store.begin(self.conn)
        try:
            expired = ops.expire_approvals(self.conn, time.time(), events)
            db_store.commit(self.conn)
        except apsw.Error as exc:
            db_store.rollback(self.conn)
            self.log.error("approval_expiry_failed", error=str(exc))
            return
        for topic, cls, fields in _hints(events):
            self._publish(topic, cls, fields)
        if expired:
            self.log.info("approvals_expired", count=expired)

    def run(self) -> None:
        self.log.info("ready", db=str(self.svc.paths.db_file), schema_version=self.schema_version,
                      writer=self.svc.endpoints.writer, events=self.svc.endpoints.events, epoch=self.epoch)
        notify_systemd("READY=1")
        lean.release_free_heap()
        parent = os.getppid() if os.environ.get("SUPERVISOR_ENABLED") else None
        while not self.svc.stopping.is_set():
            if parent is not None and os.getppid() != parent:  # supervisord died: do not live on as an orphan
                self.log.warning("stop_requested", reason="supervisord is gone")
                break
            now = time.monotonic()
            self._beat(now)
            self.maint.on_timer(now)
            self.reserve.on_timer(now)
            self._expire_approvals(now)
            for req in self.own_log.requests(now, self.svc.cfg.retention.audit_days):  # its own warnings
                self._commit_batch([(b"", req)])
            for topic, cls, fields in _hints(self.clock.on_timer(self.conn, now)):
                self._publish(topic, cls, fields)
            if self.maint.backup is not None:
                timeout = 0
            else:
                due = min(self.next_beat, self.next_service_beat, self.maint.next_due())
                timeout = max(0, min(POLL_MAX_MS, int((due - now) * 1000) + 1))
            if self.carry or self.poller.poll(timeout):
                batch = self._drain()
                if batch:
                    self._commit_batch(batch)
            self._step_backup()
        self.stop()

    def stop(self) -> None:
        notify_systemd("STOPPING=1")
        batch = self._drain()  # what already arrived is committed and acked before we go
        while batch:
            self._commit_batch(batch)
            batch, self.carry = self.carry[:self.batch_max], self.carry[self.batch_max:]
        self.maint.abort_backup()
        for ident, request_id, _key in self.backup_waiters:
            self._send_ack(ident, m.Ack(id=request_id, ok=False, code="internal", error="the writer stopped"))
        self.clock.persist(self.conn)  # its last reading, for a writer that starts on a new host boot
        try:
            self.maint.checkpoint("TRUNCATE")
        except apsw.Error as exc:
            self.log.warning("final_checkpoint_failed", error=str(exc))
        self.router.close(linger=bus.LINGER_MS)
        self.pub.close(linger=bus.LINGER_MS)
        self.conn.close()
        self.log.info("stopped", dropped_frames=dict(self._drop.counts))


def _hints(events: list[ops.Pending]) -> list[ops.Pending]:
    """Events are hints to re-read: one per commit for turns (a runner woken by any claims whatever is
    claimable) and one per chat for the outbox (each gateway process re-reads only its chats) is enough."""
    latest: dict[tuple, ops.Pending] = {}
    for event in events:
        topic, _cls, fields = event
        latest[(topic, None if topic == m.TOPIC_TURN else fields.get("session_id"), fields.get("chat"))] = event
    return list(latest.values())


def _unlink_stale_ipc(endpoint: str) -> None:
    """A socket file left by a killed writer would make bind fail; only the writer binds these."""
    if endpoint.startswith("ipc://"):
        Path(endpoint[len("ipc://"):]).unlink(missing_ok=True)


def hold_writer_lock(svc: Service) -> int:
    """One writer per database, whoever started it (supervisord, systemd, by hand): an exclusive
    flock on data/run/writer.lock, held for the life of the process and released by the kernel
    even on kill -9. Returns the lock's file descriptor; raises StarlingError when another holds it."""
    lock_file = svc.paths.run_dir / "writer.lock"
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise StarlingError(
            f"{svc.paths.db_file}: another writer (pid {holder}) already holds it; only one writer may run"
            " per database (is Starling running under both supervisord and systemd?)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    svc = boot("writer", argv, description="Starling's single SQLite writer")
    try:
        hold_writer_lock(svc)
        conn = startup.open_database(svc)
    except startup.REFUSALS as exc:  # damaged, foreign or too new: exit 78, not restarted
        return startup.refuse(svc, exc, started)
    except StarlingError as exc:
        svc.log.error("startup_failed", error=str(exc))
        return 1
    except apsw.Error as exc:  # an I/O error, say: worth another try, so no refusal
        svc.log.error("startup_failed", db=str(svc.paths.db_file), error=f"{type(exc).__name__}: {exc}")
        return 1
    writer = Writer(svc, conn)
    try:
        if writer.maint.backfill_fts():
            svc.log.info("fts_backfilled")
        writer.run()
    except db.UNUSABLE_ERRORS as exc:  # damage the bounded check at boot did not reach
        writer.router.close(linger=0)
        writer.pub.close(linger=0)
        return startup.refuse(svc, db.unusable(svc.paths.db_file, exc), started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
