"""Workers and what they hold: a process enlisting under its name (a live twin refused, a gone
predecessor's turns and outbox rows taken back at once), heartbeats that keep a worker known alive, and
claims of turns, with the turns that crash their runner.

Whether a predecessor is gone is judged here, inside the writer's transaction, so that two newcomers
under one name are serialised: the first takes over, the second finds the first alive and is refused.
The judgement (common/identity.py): a pid in the writer's own pid scope is looked up in /proc (the pid
and its start time); a host that rebooted took its processes with it; anything else counts as gone once
silent for longer than the newcomer's ``stale_after_s``. A live pid is never judged by its heartbeat: a
writer outage leaves every heartbeat old.

Poison: a runner that dies (a segfault, an OOM kill; it said nothing) costs the turns it held no attempt.
Which one killed it: when it held one turn, that one (``crashes`` + 1); when it held several, any of them,
so each becomes a suspect. Either way the turn runs alone from then on: it is claimed only by a runner
holding nothing else (``ClaimTurn.alone``), which claims nothing beside it, and other runners stop
claiming until they are idle when one waits (``alone_waiting``). So every later crash is known to be its
own, and at turn_store.MAX_CRASHES the turn is failed: the person is told, ``alert_to`` is alerted and an
audit row says so. The same when a gone runner is found through a lease that ran out (no successor).
"""

from __future__ import annotations

import json
import time

from common import identity
from common.stores import audit_store, outbox_store, turn_store, worker_store
from schema import messages as m
from services.writer import apply as _apply  # Rejected, Pending (apply imports this module: looked up at call time)
from services.writer.lease_clock import lease_of

WRITER_SCOPE = identity.pid_scope()  # where the writer can look a pid up


def enlist(conn, op: m.Enlist, now: float, events: list) -> m.Enlisted:
    if not op.name or not op.worker:
        raise _apply.Rejected("invalid", "an enlistment needs the process's name and worker id")
    if not 0 < op.stale_after_s <= 86400:  # also refuses NaN
        raise _apply.Rejected("invalid", f"stale_after_s must be in (0, 86400], not {op.stale_after_s}")
    at = lease_of(now)
    prev = worker_store.get(conn, op.name)
    if prev is not None and prev.worker == op.worker:
        return m.Enlisted()  # the same process asking again
    if prev is not None:
        alive = why_alive(prev, op, at)
        if alive:
            raise _apply.Rejected("conflict", f"{op.name} is already running: {alive}. Stop it first, or start this"
                                  " one under another --name")
    worker_store.put(conn, op.name, op.worker, op.pid, op.pid_start, op.host, op.pid_scope, now, at)
    if prev is None:  # the first under this name since workers were recorded: a gateway of before held
        legacy = f"{op.name}@{op.host}"  # its rows as <name>@<host>, taken back by its successor at start
        outbox = take_back_outbox(conn, legacy, events) if op.host else []
        return m.Enlisted(predecessor=legacy if outbox else "", outbox=outbox)
    turns, poisoned = take_back_turns(conn, prev.worker, events, prev.state != "stopped", op.alert_to, now)
    return m.Enlisted(predecessor=prev.worker, turns=turns, outbox=take_back_outbox(conn, prev.worker, events),
                      poisoned=poisoned)


def why_alive(prev: worker_store.Worker, op: m.Enlist, at: float) -> str:
    """What shows ``prev`` still runs ("" when it is provably gone)."""
    if prev.state == "stopped":
        return ""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(prev.since))
    who = f"pid {prev.pid} on {prev.host or 'an unknown host'}, since {since}"
    if prev.pid_scope and prev.pid_scope == WRITER_SCOPE:
        return who if identity.still_runs(prev.pid, prev.pid_start) else ""
    boot, new_boot = identity.scope_boot(prev.pid_scope), identity.scope_boot(op.pid_scope)
    if prev.host == op.host and boot and new_boot and boot != new_boot:
        return ""  # its host rebooted since
    silent = at - prev.seen
    return f"{who}, last heard of {silent:.0f} s ago" if silent <= op.stale_after_s else ""


def take_back_turns(conn, worker: str, events: list, crashed: bool = False, alert_to: str = "",
                    now: float = 0.0) -> tuple[list[int], list[int]]:
    """The turns a gone worker held are pending again now, their attempt given back; when it ``crashed``
    (it did not say it stopped) they run alone from now on, and the one it held alone counts a crash.
    Returns (taken back, failed as poison)."""
    held = turn_store.held_turns(conn, worker)
    how = "" if not crashed else "alone" if len(held) == 1 else "among"
    taken, poisoned = [], []
    for turn_id, session_id in held:
        if not turn_store.take_back(conn, turn_id, worker, how):
            continue
        if how == "alone" and turn_store.crashes(conn, turn_id)[0] >= turn_store.MAX_CRASHES:
            poisoned.append(turn_id)
            fail_turn(conn, turn_id, "poisoned", worker, alert_to, now, events)
            continue
        taken.append(turn_id)
        events.append((m.TOPIC_TURN, m.TurnPending, {"session_id": session_id, "turn_id": turn_id}))
    return taken, poisoned


POISONED_REPLY = ("I could not handle this message: each time I tried, the program answering it stopped. The"
                  " operator has been told.")
GAVE_UP_REPLY = ("I could not handle this message: it was tried {n} times and never finished. The operator has"
                 " been told.")


def fail_turn(conn, turn_id: int, why: str, worker: str, alert_to: str, now: float, events: list) -> None:
    """A turn out of the queue for good (``why``: poisoned, it crashed its runner MAX_CRASHES times; or
    gave_up, MAX_ATTEMPTS claims never finished): the person is told, the operator alerted, an audit row."""
    turn = turn_store.details(conn, turn_id)
    if turn is None:
        return
    crashes = turn_store.crashes(conn, turn_id)[0]
    if why == "poisoned":
        error = f"crashed its runner {crashes} times"
        turn_store.fail_waiting(conn, turn_id, error, now)
        reply = POISONED_REPLY
    else:  # claim_next failed it already
        error = f"gave up after {turn.attempt} attempts"
        reply = GAVE_UP_REPLY.format(n=turn.attempt)
    _apply._enqueue(conn, turn.session_id, turn_id, turn.instance, turn.chat,
                    [m.Reply(text=reply, reply_to=turn.platform_msg_id)], now, events)
    instance, _, chat = alert_to.partition(":")
    if instance and chat:
        alert = (f"Starling: turn {turn_id} (agent {turn.agent}, {turn.instance}:{turn.chat}) was failed: {error};"
                 f" the person was told. See `starling session show {turn.session_id}`.")
        _apply._enqueue(conn, None, None, instance, chat, [m.Reply(text=alert)], now, events)
    audit_store.record_event(conn, now, "writer", f"turn_{why}", f"turn:{turn_id}", json.dumps(
        {"session_id": turn.session_id, "agent": turn.agent, "instance": turn.instance, "chat": turn.chat,
         "error": error, "crashes": crashes, "runner": worker}))
    if turn_store.has_work(conn, turn.session_id):  # the session's next turn may run now
        events.append((m.TOPIC_TURN, m.TurnPending, {"session_id": turn.session_id, "turn_id": 0}))


def claim(conn, op: m.ClaimTurn, now: float, events: list) -> m.TurnClaim | m.NoWork:
    """The next turn for this runner. First, turns whose lease ran out under a runner provably dead (in the
    writer's pid scope) are taken back as its successor would (no attempt lost, quarantined)."""
    lease_s = _apply._lease(op.lease_s)
    at = lease_of(now)
    for owner in turn_store.expired_owners(conn, at):
        record = worker_store.of_worker(conn, owner)
        if (record is not None and record.state != "stopped" and record.pid_scope == WRITER_SCOPE
                and not identity.still_runs(record.pid, record.pid_start)):
            take_back_turns(conn, owner, events, True, op.alert_to, now)
    gave_up: list[int] = []
    claimed = turn_store.claim_next(conn, op.worker, lease_s, now, at, op.alone, gave_up)
    for turn_id in gave_up:
        fail_turn(conn, turn_id, "gave_up", op.worker, op.alert_to, now, events)
    waiting = not op.alone and turn_store.quarantine_waiting(conn)
    if claimed is None:
        return m.NoWork(alone_waiting=waiting)
    return m.TurnClaim(**claimed._asdict(), alone_waiting=waiting)


def take_back_outbox(conn, worker: str, events: list) -> list[int]:
    """The outbox rows a gone worker held are pending again now; their attempt counts (the platform call
    it was in may have gone out: the gateway counts it as retaken)."""
    taken = []
    for outbox_id in outbox_store.held_by(conn, worker):
        row = outbox_store.get(conn, outbox_id)
        if row is not None and outbox_store.release(conn, outbox_id, worker, untouched=False):
            taken.append(outbox_id)
            events.append((m.topic_outbox(row.instance), m.OutboxPending,
                           {"instance": row.instance, "chat": row.chat, "outbox_id": outbox_id}))
    return taken


def beat(conn, op: m.Heartbeat, now: float) -> None:
    """A beat of an enlisted worker keeps it known alive; one whose name another process took over is
    refused (``conflict``): it was judged gone, and must stop (common/runtime.py)."""
    state = "stopped" if op.state == "stopped" else "running"
    if worker_store.seen(conn, op.service, op.worker, lease_of(now), state):
        return
    current = worker_store.get(conn, op.service)
    if current is not None:
        raise _apply.Rejected("conflict", f"superseded: {op.service} is now pid {current.pid} on {current.host}"
                              f" ({current.worker}); this process ({op.worker}) was judged gone")
