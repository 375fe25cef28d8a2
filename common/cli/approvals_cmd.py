"""`starling approvals list|approve|deny`: what agents are waiting for a person to allow."""

from __future__ import annotations

import argparse
import getpass
import time

from common import db
from common.cli import output
from common.cli.context import Context
from common.errors import StarlingError, WriteRejected
from common.stores import approval_store, session_store
from schema import messages as m


def register(verbs) -> None:
    approvals = verbs.add_parser("approvals", help="list, approve or deny what agents asked to do")
    sub = approvals.add_subparsers(dest="approvals_verb", metavar="VERB")
    listing = sub.add_parser("list", help="pending approvals: id, agent, chat, tool, what it would do, expiry")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=cmd_list)
    approve = sub.add_parser("approve", help="allow one pending action (the agent's turn resumes)")
    approve.add_argument("id")
    approve.add_argument("--always", action="store_true", help="also allow the same call from now on")
    approve.set_defaults(func=lambda a: decide(a, True))
    deny = sub.add_parser("deny", help="refuse one pending action (the agent is told)")
    deny.add_argument("id")
    deny.set_defaults(func=lambda a: decide(a, False))
    approvals.set_defaults(func=cmd_list, json=False)


def cmd_list(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    conn = ctx.reader()
    try:
        with db.read_tx(conn):
            rows = []
            for a in approval_store.pending(conn):
                session = session_store.get(conn, a.session_id) if a.session_id else None
                rows.append({"id": a.id, "agent": a.agent, "chat": f"{session.instance}:{session.chat}" if session else "-",
                             "tool": a.tool, "reason": a.reason, "expires_in_s": round(a.expires_at - time.time())})
    finally:
        conn.close()
    if getattr(args, "json", False):
        output.emit_json(rows)
        return 0
    if not rows:
        print("No pending approvals.")
        return 0
    print(output.table(["ID", "AGENT", "CHAT", "TOOL", "WHAT", "EXPIRES IN"],
                       [[r["id"], r["agent"], r["chat"], r["tool"], r["reason"], output.duration(r["expires_in_s"])]
                        for r in rows]))
    return 0


def decide(args: argparse.Namespace, approve: bool) -> int:
    ctx = Context.from_args(args)
    approval_id = args.id.strip().upper()
    conn = ctx.reader()
    try:
        with db.read_tx(conn):
            approval = approval_store.get(conn, approval_id)
    finally:
        conn.close()
    if approval is None:
        raise StarlingError(f"no approval {approval_id}; see `starling approvals list`")
    always = approve and getattr(args, "always", False)
    try:
        ctx.call(m.DecideApproval(approval_id=approval_id, approve=approve, decided_by=f"cli:{getpass.getuser()}",
                                  always=always, grant_pattern=approval.arguments if always else ""))
    except WriteRejected as exc:
        raise StarlingError(f"approval {approval_id}: {str(exc).split(': ', 1)[-1]}") from None
    print(f"{'Approved' if approve else 'Denied'} {approval_id} ({approval.agent}: {approval.tool}).")
    return 0
