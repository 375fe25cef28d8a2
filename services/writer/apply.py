"""What each write request does to the database, and which events it makes once committed."""

from __future__ import annotations

import secrets

import msgspec

from common.stores import (
    access_store, approval_store, audit_store, beat_store, dead_letter_store, fold_store, job_store, outbox_store,
    session_store, skill_store, turn_store,
)
from schema import messages as m
from services.writer import dashboard_ops, inbound_ops, lease_ops, retention_ops, schedule_ops
from services.writer.lease_clock import lease_of

_json = msgspec.json.Encoder()

# Writes whose replay is harmless or that carry their own natural key: their answers are not
# stored in write_keys (Inbound dedupes on the platform's event ids in inbound_keys).
UNRECORDED = (m.Inbound, m.Heartbeat, m.Ping, m.RenewLease, m.RecordDelivery)
# Operations the writer runs on their own, outside a group commit.
MAINTENANCE = (m.Checkpoint, m.Backup, m.FtsRebuild)

TURN_ROLES = ("assistant", "tool", "system", "summary")
DELIVERY_STATES = ("sent", "delivered", "read", "failed")


class Rejected(Exception):
    """A request that cannot be applied: its error ack carries ``code`` and the message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# An event before its epoch and sequence number are known: (topic, struct class, fields).
Pending = tuple[str, type, dict]


def apply(conn, op: m.WriteOp, now: float, events: list[Pending]) -> m.Result:
    """Apply one write inside the caller's transaction; append the events it makes to ``events``."""
    match op:
        case m.Inbound():
            return inbound_ops.store_one(conn, op, now, events)
        case m.ClaimTurn():
            return lease_ops.claim(conn, op, now, events)
        case m.RenewLease():
            return _renew(conn, op, now)
        case m.AppendTurn():
            if op.role not in TURN_ROLES:
                raise Rejected("invalid", f"role must be one of {', '.join(TURN_ROLES)}, not {op.role!r}")
            # only the holder of the turn being answered may add to it (a runner whose lease ran out may not)
            if turn_store.held_by(conn, op.parent_turn_id, op.worker) != op.session_id:
                raise Rejected("lease_lost", f"turn {op.parent_turn_id} of session {op.session_id} is not held"
                               f" by {op.worker}")
            turn_id = turn_store.add_turn(conn, op.session_id, op.role, op.content, op.meta, now,
                                          op.parent_turn_id or None)
            return m.Stored(id=turn_id)
        case m.FinishTurn():
            return _finish(conn, op, now, events)
        case m.FoldTurns():
            folded = fold_store.fold(conn, op.turn_id, op.worker, now)
            if folded is None:
                raise Rejected("lease_lost", f"turn {op.turn_id} is not held by {op.worker}")
            return m.Folded(ids=folded)
        case m.SetTurnText():
            if not turn_store.set_user_text(conn, op.turn_id, op.worker, op.content):
                raise Rejected("lease_lost", f"user turn {op.turn_id} is not held by {op.worker}")
            return m.Done()
        case m.DraftSkill():
            if op.turn_id and turn_store.held_by(conn, op.turn_id, op.worker) is None:
                raise Rejected("lease_lost", f"turn {op.turn_id} is not held by {op.worker}")
            return m.Stored(id=skill_store.save_draft(conn, op.agent, op.name, op.description[:300], op.body,
                                                      op.session_id or None, now))
        case m.DecideSkillDraft():
            if op.state not in ("accepted", "rejected"):
                raise Rejected("invalid", f"state must be accepted or rejected, not {op.state!r}")
            if not skill_store.decide(conn, op.id, op.state, now):
                raise Rejected("not_found", f"skill draft {op.id} does not exist or was decided already")
            return m.Done()
        case m.ReleaseTurn():
            session_id = turn_store.session_of(conn, op.turn_id)
            if session_id is None or not turn_store.release(conn, op.turn_id, op.worker):
                raise Rejected("lease_lost", f"turn {op.turn_id} is not held by {op.worker}")
            events.append((m.TOPIC_TURN, m.TurnPending, {"session_id": session_id, "turn_id": op.turn_id}))
            return m.Done()
        case m.EnqueueOutbox():
            if op.turn_id and turn_store.held_by(conn, op.turn_id, op.worker) is None:
                raise Rejected("lease_lost", f"turn {op.turn_id} is not held by {op.worker}")
            if op.session_id:
                _need_session(conn, op.session_id)
            ids = _enqueue(conn, op.session_id or None, None, op.instance, op.chat, op.replies, now, events)
            return m.Queued(ids=ids)
        case m.ClaimOutbox():
            leased = lease_of(now)  # leases and retry times are on the lease clock (services/writer/lease_clock.py)
            items = outbox_store.claim(conn, op.instances, op.worker, max(1, op.limit), _lease(op.lease_s), leased,
                                       op.chats)
            return m.OutboxClaim(items=[m.OutboxItem(**i._asdict()) for i in items], lease_until=leased + _lease(op.lease_s))
        case m.OutboxSent():
            row = _held_outbox(conn, op.id)
            if not outbox_store.mark_sent(conn, op.id, op.worker, op.platform_msg_id, now):
                raise Rejected("lease_lost", f"outbox row {op.id} is not held by {op.worker}")
            events.append((m.topic_outbox(row.instance), m.OutboxPending,
                           {"instance": row.instance, "chat": row.chat, "outbox_id": 0}))
            return m.Done()
        case m.OutboxFailed():
            if not (op.retry_after_s < 0 or 0 <= op.retry_after_s <= 86400):  # also refuses NaN and infinity
                raise Rejected("invalid", f"retry_after_s must be negative (never) or 0..86400, not {op.retry_after_s}")
            _held_outbox(conn, op.id)
            if not outbox_store.mark_failed(conn, op.id, op.worker, op.error, op.retry_after_s, lease_of(now)):
                raise Rejected("lease_lost", f"outbox row {op.id} is not held by {op.worker}")
            return m.Done()
        case m.OutboxProgress():
            if op.parts_sent < 0:
                raise Rejected("invalid", f"parts_sent must be 0 or more, not {op.parts_sent}")
            _held_outbox(conn, op.id)
            if not outbox_store.progress(conn, op.id, op.worker, op.parts_sent, op.platform_msg_id):
                raise Rejected("lease_lost", f"outbox row {op.id} is not held by {op.worker}")
            return m.Done()
        case m.RecordDelivery():
            if op.status not in DELIVERY_STATES:
                raise Rejected("invalid", f"status must be one of {', '.join(DELIVERY_STATES)}, not {op.status!r}")
            outbox_store.record_delivery(conn, op.instance, op.platform_msg_id, op.status, op.error[:1000])
            return m.Done()
        case m.ReleaseOutbox():
            for outbox_id in (outbox_store.held_by(conn, op.worker) if op.all_held else op.ids):
                row = outbox_store.get(conn, outbox_id)
                if row is not None and outbox_store.release(conn, outbox_id, op.worker,
                                                                   untouched=op.untouched and not op.all_held):
                    events.append((m.topic_outbox(row.instance), m.OutboxPending,
                                   {"instance": row.instance, "chat": row.chat, "outbox_id": outbox_id}))
            return m.Done()
        case m.Heartbeat():
            beat_store.record(conn, op.service, op.pid, op.state, op.detail, now, op.parent_pid)
            if op.worker:
                lease_ops.beat(conn, op, now)
            return m.Done()
        case m.Enlist():
            return lease_ops.enlist(conn, op, now, events)
        case m.Ping():
            return m.Done()
        case m.CloseSession():
            _need_session(conn, op.session_id)
            session_store.close(conn, op.session_id, op.reason, now)
            return m.Done()
        case m.SetSummary():
            _need_session(conn, op.session_id)
            session_store.set_summary(conn, op.session_id, op.summary, op.upto_turn_id)
            return m.Done()
        case m.RecordTool():
            return m.Stored(id=audit_store.record_tool(
                conn, op.session_id or None, op.turn_id, op.agent, op.tool, op.arguments, op.outcome,
                op.result_path, op.error, op.duration_ms, now))
        case m.RecordUsage():
            return m.Stored(id=audit_store.record_usage(
                conn, op.session_id or None, op.turn_id, op.agent, op.provider, op.model, op.input_tokens,
                op.output_tokens, op.cost_usd, now))
        case m.ParkTurn():
            return _park(conn, op, now, events)
        case m.DecideApproval():
            return _decide(conn, op, now, events)
        case m.CronAdd():
            return schedule_ops.add(conn, op, now, events)
        case m.CronRemove():
            return schedule_ops.remove(conn, op, events)
        case m.CronSetEnabled():
            return schedule_ops.set_enabled(conn, op, now, events)
        case m.CronFire():
            return schedule_ops.fire(conn, op, now, events)
        case m.CronSkip():
            return schedule_ops.skip(conn, op, now)
        case m.CronRunEnd():
            return schedule_ops.end_run(conn, op, now, events)
        case m.JobStarted():
            return m.Stored(id=job_store.start(conn, op.session_id or None, op.agent, op.command, op.pid,
                                               op.log_path, now))
        case m.JobEnded():
            if op.state not in ("done", "failed", "killed"):
                raise Rejected("invalid", f"state must be done, failed or killed, not {op.state!r}")
            job_store.end(conn, op.job_id, op.state, op.exit_code, now)
            return m.Done()
        case m.RequestPairing():
            return _pairing(conn, op, now)
        case m.ApprovePairing():
            code = access_store.get_code(conn, op.code.strip().upper())
            if code is None:
                raise Rejected("not_found", f"no pairing code {op.code!r}")
            if code.approved_at is not None:
                raise Rejected("conflict", f"pairing code {code.code} was already approved")
            if code.expires_at <= now:
                raise Rejected("conflict", f"pairing code {code.code} expired; the sender can ask for a new one")
            access_store.approve_code(conn, code.code, now)
            access_store.allow(conn, code.instance, code.sender, op.approved_by, now)
            return m.Done()
        case m.RefusePairing():
            return dashboard_ops.refuse_pairing(conn, op, now)
        case m.RevokeSender():
            return dashboard_ops.revoke_sender(conn, op, now)
        case m.DashboardAccount():
            return dashboard_ops.account(conn, op, now)
        case m.DashboardLogin():
            return dashboard_ops.login(conn, op, now)
        case m.DashboardLogout():
            return dashboard_ops.logout(conn, op, now)
        case m.DashboardAudit():
            return dashboard_ops.audit(conn, op, now)
        case m.RecordDaemonLog():
            return dashboard_ops.daemon_log(conn, op)
        case m.PurgeSessions():
            retention_ops.check_clock(conn, now)
            return retention_ops.purge_sessions(conn, op)
        case m.PurgeAudit():
            retention_ops.check_clock(conn, now)
            return retention_ops.purge_audit(conn, op)
        case m.PurgeJobs():
            retention_ops.check_clock(conn, now)
            return retention_ops.purge_jobs(conn, op)
        case m.ConfirmClock():
            return retention_ops.confirm_clock(conn, op, now)
        case m.ResetSession():
            return retention_ops.reset_session(conn, op, now)
        case m.MarkCaptured():
            return retention_ops.mark_captured(conn, op, now)
        case m.DeadLetter():
            return m.Stored(id=dead_letter_store.add(conn, op.platform, op.instance, op.event_key, op.reason[:2000],
                                                     op.payload, op.received_at, now))
    raise Rejected("invalid", f"{type(op).__name__} is not a write the writer applies in a batch")


def _lease(seconds: float) -> float:
    if not 0 < seconds <= 3600:
        raise Rejected("invalid", f"lease_s must be in (0, 3600], not {seconds}")
    return seconds


def _renew(conn, op: m.RenewLease, now: float) -> m.Leased:
    lease_s = _lease(op.lease_s)
    if op.kind == "turn":
        until = turn_store.renew(conn, op.id, op.worker, lease_s, lease_of(now))
    elif op.kind == "outbox":
        until = outbox_store.renew(conn, op.id, op.worker, lease_s, lease_of(now))
    else:
        raise Rejected("invalid", f"kind must be turn or outbox, not {op.kind!r}")
    if until is None:
        raise Rejected("lease_lost", f"{op.kind} {op.id} is not held by {op.worker}")
    return m.Leased(lease_until=until)


def _finish(conn, op: m.FinishTurn, now: float, events: list[Pending]) -> m.Queued:
    turn = turn_store.get(conn, op.turn_id)
    if turn is None:
        raise Rejected("not_found", f"turn {op.turn_id} does not exist")
    if not turn_store.finish(conn, op.turn_id, op.worker, op.ok, op.error, now):
        raise Rejected("lease_lost", f"turn {op.turn_id} is not held by {op.worker}")
    session = session_store.get(conn, turn.session_id)
    if op.answer:
        turn_store.add_turn(conn, turn.session_id, "assistant", op.answer, op.meta, now, op.turn_id)
    session_store.touch(conn, turn.session_id, now)
    ids = _enqueue(conn, turn.session_id, op.turn_id, session.instance, session.chat, op.replies, now, events)
    if turn_store.has_work(conn, turn.session_id):  # the session's next turn may run now
        events.append((m.TOPIC_TURN, m.TurnPending, {"session_id": turn.session_id, "turn_id": 0}))
    return m.Queued(ids=ids)


def _enqueue(conn, session_id, turn_id, instance: str, chat: str, replies: list[m.Reply], now: float,
             events: list[Pending]) -> list[int]:
    ids = []
    for reply in replies:
        if not reply.text and not reply.file_path:
            raise Rejected("invalid", "a reply needs text or a file")
        outbox_id = outbox_store.enqueue(
            conn, session_id, turn_id, instance, chat, reply.text, reply.file_path, reply.reply_to, now,
            reply.approval_id,
        )
        ids.append(outbox_id)
        events.append((m.topic_outbox(instance), m.OutboxPending,
                       {"instance": instance, "chat": chat, "outbox_id": outbox_id}))
    return ids


def _need_session(conn, session_id: int) -> None:
    if session_store.get(conn, session_id) is None:
        raise Rejected("not_found", f"session {session_id} does not exist")


def _held_outbox(conn, outbox_id: int) -> outbox_store.Row:
    row = outbox_store.get(conn, outbox_id)
    if row is None:
        raise Rejected("not_found", f"outbox row {outbox_id} does not exist")
    return row


def _park(conn, op: m.ParkTurn, now: float, events: list[Pending]) -> m.Done:
    turn = turn_store.get(conn, op.turn_id)
    if turn is None:
        raise Rejected("not_found", f"turn {op.turn_id} does not exist")
    if not 0 < op.ttl_s <= 7 * 86400:
        raise Rejected("invalid", f"ttl_s must be in (0, 7 days], not {op.ttl_s}")
    if not turn_store.park(conn, op.turn_id, op.worker):
        raise Rejected("lease_lost", f"turn {op.turn_id} is not held by {op.worker}")
    session = session_store.get(conn, turn.session_id)
    approval_store.create(conn, op.approval_id, turn.session_id, op.turn_id, session.agent, op.tool, op.arguments,
                          op.reason, now, op.ttl_s)
    if op.notice:
        _enqueue(conn, turn.session_id, op.turn_id, session.instance, session.chat, [m.Reply(text=op.notice, approval_id=op.approval_id)],
                 now,
                 events)
    return m.Done()


def _decide(conn, op: m.DecideApproval, now: float, events: list[Pending]) -> m.Done:
    approval = approval_store.get(conn, op.approval_id)
    if approval is None:
        raise Rejected("not_found", f"no approval {op.approval_id!r}")
    if approval.state != "pending":
        raise Rejected("conflict", f"approval {op.approval_id} is already {approval.state}")
    if approval.expires_at <= now:  # the writer's expiry timer resumes its turn
        raise Rejected("conflict", f"approval {op.approval_id} expired")
    approval_store.decide(conn, op.approval_id, "approved" if op.approve else "denied", op.decided_by, now)
    if op.approve and op.always:
        approval_store.grant(conn, approval.agent, approval.tool, op.grant_pattern or approval.arguments,
                             op.decided_by, now)
    _resume(conn, approval, events)
    return m.Done()


def _resume(conn, approval: approval_store.Approval, events: list[Pending]) -> None:
    if approval.turn_id and turn_store.unpark(conn, approval.turn_id):
        events.append((m.TOPIC_TURN, m.TurnPending,
                       {"session_id": approval.session_id or 0, "turn_id": approval.turn_id}))


def expire_approvals(conn, now: float, events: list[Pending]) -> int:
    """Mark approvals past their time expired and put their turns back to work (the runner tells the model)."""
    approval_ids = approval_store.due(conn, now)
    for approval_id in approval_ids:
        approval = approval_store.get(conn, approval_id)
        if approval is not None and approval_store.decide(conn, approval_id, "expired", "timeout", now):
            _resume(conn, approval, events)
    return len(approval_ids)


PAIRING_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I/L: read out and typed by people
PAIRING_TTL_S = 3600.0
# One live code per sender (asking again returns it), and room for many senders per instance: a
# handful of strangers must not lock newcomers out for an hour, while a flood still stops short of
# burying the operator's `starling pairing list`.
PAIRING_MAX_PENDING = 50


def _pairing(conn, op: m.RequestPairing, now: float) -> m.Pairing:
    if access_store.is_allowed(conn, op.instance, op.sender):
        return m.Pairing(status="allowed")
    existing = access_store.code_for_sender(conn, op.instance, op.sender, now)
    if existing is not None:  # asking again gives the same code: no new codes by repeating
        return m.Pairing(status="existing", code=existing.code, expires_at=existing.expires_at)
    if access_store.count_pending(conn, op.instance, now) >= PAIRING_MAX_PENDING:
        return m.Pairing(status="full")
    code = "".join(secrets.choice(PAIRING_ALPHABET) for _ in range(8))
    created = access_store.create_code(conn, code, op.instance, op.sender, op.chat, op.sender_name, now,
                                       PAIRING_TTL_S)
    return m.Pairing(status="new", code=created.code, expires_at=created.expires_at)
