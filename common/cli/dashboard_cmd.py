"""`starling dashboard user add|list|rm|passwd`: the dashboard's accounts (roles admin and viewer), changed
through the writer and audited; a password comes from stdin (at a terminal: typed twice, not echoed)."""

from __future__ import annotations

import argparse
import getpass
import sys
import time

from common import dashboard_accounts as accounts
from common import db
from common.cli import output
from common.cli.context import Context
from common.errors import InvalidInput, StarlingError, WriteRejected
from common.stores import dashboard_store
from schema import messages as m


def register(verbs) -> None:
    dash = verbs.add_parser("dashboard", help="the web dashboard's accounts (add, list, remove, new password)",
                            description="The dashboard is served by the control service at / on [control] listen;"
                                        " nothing shows without an account.")
    sub = dash.add_subparsers(dest="dashboard_verb", metavar="VERB", required=True)
    user = sub.add_parser("user", help="dashboard accounts: add, list, rm, passwd")
    actions = user.add_subparsers(dest="user_verb", metavar="ACTION", required=True)
    add = actions.add_parser("add", help="add an account; the password is read from stdin (typed twice at a terminal)")
    add.add_argument("name", metavar="NAME", help="1-32 characters of a-z 0-9 _ . -")
    add.add_argument("--role", default="admin", choices=accounts.ROLES,
                     help="admin: every page and every change (default); viewer: every page, no change")
    add.set_defaults(func=cmd_add)
    listing = actions.add_parser("list", help="accounts: name, role, created, last login, locked")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(func=cmd_list)
    rm = actions.add_parser("rm", help="remove an account (its sessions end at once)")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=cmd_rm)
    passwd = actions.add_parser("passwd", help="set a new password (the account's sessions end; a lockout too)")
    passwd.add_argument("name", metavar="NAME")
    passwd.set_defaults(func=cmd_passwd)


def _usage(message: str) -> int:
    output.error(message)
    return 2


def read_password(name: str) -> str:
    """At a terminal: asked twice, never echoed; otherwise the first line of stdin."""
    if sys.stdin.isatty():
        first = getpass.getpass(f"password for {name} (not shown, at least {accounts.MIN_PASSWORD} characters): ")
        if getpass.getpass("the same again: ") != first:
            raise InvalidInput("the two passwords differ")
        return first
    line = sys.stdin.readline()
    return line[:-2] if line.endswith("\r\n") else line.removesuffix("\n")


def _by() -> str:
    return f"cli:{getpass.getuser()}"


def _call(ctx: Context, op: m.DashboardAccount, name: str) -> None:
    try:
        ctx.call(op)
    except WriteRejected as exc:
        raise StarlingError(f"dashboard account {name!r}: {str(exc).split(': ', 1)[-1]}") from None


def _new_password(args: argparse.Namespace) -> tuple[str, str]:
    name = accounts.check_username(args.name)
    password = accounts.check_password(read_password(name), name)
    return name, accounts.hash_password(password)


def cmd_add(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    try:
        name, hashed = _new_password(args)
    except InvalidInput as exc:
        return _usage(str(exc))
    _call(ctx, m.DashboardAccount(action="add", username=name, password_hash=hashed, role=args.role, by=_by()), name)
    print(f"Added dashboard account {name!r} ({args.role}); log in at {dashboard_url(ctx)}")
    return 0


def cmd_passwd(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    try:
        name, hashed = _new_password(args)
    except InvalidInput as exc:
        return _usage(str(exc))
    _call(ctx, m.DashboardAccount(action="passwd", username=name, password_hash=hashed, by=_by()), name)
    print(f"New password set for {name!r}; its sessions have ended.")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    try:
        name = accounts.check_username(args.name)
    except InvalidInput as exc:
        return _usage(str(exc))
    _call(ctx, m.DashboardAccount(action="rm", username=name, by=_by()), name)
    print(f"Removed dashboard account {name!r}; its sessions have ended.")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    conn = ctx.reader()
    try:
        with db.read_tx(conn):
            found = dashboard_store.accounts(conn)
    finally:
        conn.close()
    now = time.time()
    rows = [{"name": a.username, "role": a.role, "created_at": a.created_at, "last_login_at": a.last_login_at,
             "locked_for_s": round(a.locked_until - now) if a.locked_until > now else 0} for a in found]
    if args.json:
        output.emit_json(rows)
        return 0
    if not rows:
        print("No dashboard accounts. Add one with `starling dashboard user add NAME`.")
        return 0
    print(output.table(["NAME", "ROLE", "CREATED", "LAST LOGIN", "LOCKED"],
                       [[r["name"], r["role"], _when(r["created_at"]), _when(r["last_login_at"]),
                         output.duration(r["locked_for_s"]) if r["locked_for_s"] else "-"] for r in rows]))
    return 0


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at)) if at else "-"


def dashboard_url(ctx: Context) -> str:
    public = ctx.cfg.control.public_url if hasattr(ctx.cfg.control, "public_url") else ""
    return (public.rstrip("/") + "/") if public else f"http://{ctx.cfg.control.listen}/"
