"""`starling retention status|confirm-clock`: whether retention holds because the wall clock jumped ahead,
and an operator's word that the time is right (services/writer/lease_clock.py)."""

from __future__ import annotations

import argparse
import getpass

from common import db
from common.cli import output
from common.cli.context import Context
from common.stores import lease_clock_store
from schema import messages as m


def register(verbs) -> None:
    retention = verbs.add_parser("retention", help="the clock check that holds retention after the wall clock"
                                 " jumped ahead, and confirming the time")
    sub = retention.add_subparsers(dest="retention_verb", metavar="VERB")
    status = sub.add_parser("status", help="how far the wall clock stands from the writer's own count of time,"
                            " and whether retention holds for it")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)
    confirm = sub.add_parser("confirm-clock", help="the time is right (you checked it): retention runs again")
    confirm.set_defaults(func=cmd_confirm)
    retention.set_defaults(func=cmd_status, json=False)


def cmd_status(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    conn = ctx.reader()
    try:
        with db.read_tx(conn):
            state = lease_clock_store.get(conn)
    finally:
        conn.close()
    if state is None:
        print("The writer has not started on this database yet.")
        return 0
    info = {"held": state.holds_retention, "unconfirmed_jump_s": round(state.jump_s, 3),
            "skew_s": round(state.skew, 3), "confirmed_skew_s": round(state.confirmed_skew, 3),
            "as_of": state.updated_at}
    if getattr(args, "json", False):
        output.emit_json(info)
        return 0
    if state.holds_retention:
        print(f"Retention holds: {lease_clock_store.held_text(state.jump_s)}.")
    else:
        print(f"Retention runs: the wall clock is {state.jump_s / 3600:+.2f} h from the writer's own count of"
              " time since the time was last confirmed (it holds past +24 h).")
    return 0


def cmd_confirm(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    confirmed = ctx.call(m.ConfirmClock(by=f"cli:{getpass.getuser()}"))
    hours = confirmed.jump_s / 3600
    if confirmed.held:
        print(f"Confirmed: the clock's jump of {hours:+.1f} h is accepted; retention runs again at the sweeper's"
              " next pass (within the hour).")
    else:
        print(f"Confirmed (retention was not held: the clock stood {hours:+.2f} h from the writer's count).")
    return 0
