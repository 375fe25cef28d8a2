"""Workers and what they hold: a process enlisting under its name (a live twin refused, a gone
predecessor's turns and outbox rows taken back at once), and heartbeats that keep a worker known alive.

Whether a predecessor is gone is judged here, inside the writer's transaction, so that two newcomers
under one name are serialised: the first takes over, the second finds the first alive and is refused.
The judgement (common/identity.py): a pid in the writer's own pid scope is looked up in /proc (the pid
and its start time); a host that rebooted took its processes with it; anything else counts as gone once
silent for longer than the newcomer's ``stale_after_s``. A live pid is never judged by its heartbeat: a
writer outage leaves every heartbeat old.
"""

from __future__ import annotations

import time

from common import identity
from common.stores import outbox_store, turn_store, worker_store
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
    if prev is None:
        return m.Enlisted()
    return m.Enlisted(predecessor=prev.worker, turns=take_back_turns(conn, prev.worker, events),
                      outbox=take_back_outbox(conn, prev.worker, events))


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


def take_back_turns(conn, worker: str, events: list) -> list[int]:
    """The turns a gone worker held are pending again now, their attempt given back."""
    taken = []
    for turn_id, session_id in turn_store.held_turns(conn, worker):
        if turn_store.release(conn, turn_id, worker):
            taken.append(turn_id)
            events.append((m.TOPIC_TURN, m.TurnPending, {"session_id": session_id, "turn_id": turn_id}))
    return taken


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
