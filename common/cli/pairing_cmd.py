"""`starling pairing list|approve`: strangers who asked to talk to an agent, and letting them in."""

from __future__ import annotations

import argparse
import getpass
import time

from common import db
from common.cli import output
from common.cli.context import Context
from common.errors import StarlingError, WriteRejected
from common.stores import access_store
from schema import messages as m


def register(verbs) -> None:
    pairing = verbs.add_parser("pairing", help="list pairing codes of unknown senders, or approve one")
    sub = pairing.add_subparsers(dest="pairing_verb", metavar="VERB")
    listing = sub.add_parser("list", help="pending pairing codes: code, gateway instance, sender, expiry")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=cmd_list)
    approve = sub.add_parser("approve", help="let the sender of a pairing code talk to the instance's agent")
    approve.add_argument("code")
    approve.set_defaults(func=cmd_approve)
    pairing.set_defaults(func=cmd_list, json=False)


def cmd_list(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    conn = ctx.reader()
    try:
        with db.read_tx(conn):
            codes = access_store.pending(conn, time.time())
    finally:
        conn.close()
    rows = [{"code": c.code, "instance": c.instance, "sender": c.sender, "name": c.sender_name, "chat": c.chat,
             "expires_in_s": round(c.expires_at - time.time())} for c in codes]
    if getattr(args, "json", False):
        output.emit_json(rows)
        return 0
    if not rows:
        print("No pending pairing codes.")
        return 0
    print(output.table(["CODE", "INSTANCE", "SENDER", "NAME", "EXPIRES IN"],
                       [[r["code"], r["instance"], r["sender"], r["name"], output.duration(r["expires_in_s"])]
                        for r in rows]))
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    code = args.code.strip().upper()
    try:
        ctx.call(m.ApprovePairing(code=code, approved_by=f"cli:{getpass.getuser()}"))
    except WriteRejected as exc:
        raise StarlingError(f"pairing {code}: {str(exc).split(': ', 1)[-1]}") from None
    print(f"Approved {code}: its sender may now talk to the agent.")
    return 0
