"""`starling whatsapp link|unlink`: link a personal number to a `mode = "linked"` gateway instance by QR
code or pair code, or unlink it. The running gateway does the work, asked through request files
(common/whatsapp_requests.py); this shows what it sends back (the QR code or pair code, its answer)."""

from __future__ import annotations

import argparse
import sys

from common import whatsapp_requests
from common.cli.context import Context
from common.errors import StarlingError


def register(verbs) -> None:
    wa = verbs.add_parser("whatsapp", help="link a personal WhatsApp number (linked-device mode), or unlink it")
    sub = wa.add_subparsers(dest="whatsapp_verb", metavar="VERB")
    sub.required = True
    link = sub.add_parser("link", help="link the number by a QR code in the terminal, or by a pair code"
                          " (the gateway must be running: `starling up`)")
    link.add_argument("instance", nargs="?", help="the [[gateways.whatsapp]] id (default: the only linked one)")
    link.add_argument("--pair-code", metavar="PHONE", default="",
                      help="show a pair code for this number (international format) instead of a QR code")
    link.add_argument("--timeout", type=float, default=180.0, metavar="S", help="give up after S seconds (180)")
    link.set_defaults(func=cmd_link)
    unlink = sub.add_parser("unlink", help="log the linked device out and delete its session")
    unlink.add_argument("instance", nargs="?", help="the [[gateways.whatsapp]] id (default: the only linked one)")
    unlink.set_defaults(func=cmd_unlink)


def _instance(ctx: Context, given: str | None) -> str:
    linked = [gw.id for gw in ctx.cfg.gateways.whatsapp if gw.mode == "linked"]
    where = ctx.home / "config.toml"
    if given:
        if given not in {gw.id for gw in ctx.cfg.gateways.whatsapp}:
            raise StarlingError(f"{where}: no [[gateways.whatsapp]] with id {given!r}")
        if given not in linked:
            raise StarlingError(f"{where}: gateways.whatsapp {given!r} has mode = \"cloud\"; set mode = \"linked\" to"
                                " link a personal number")
        return given
    if len(linked) == 1:
        return linked[0]
    if not linked:
        raise StarlingError(f"{where}: no [[gateways.whatsapp]] with mode = \"linked\"; add one first")
    raise StarlingError(f"several linked WhatsApp instances ({', '.join(linked)}): name one")


def _show(text: str) -> None:
    print(text, flush=True)


def cmd_link(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    instance = _instance(ctx, args.instance)
    phone = "".join(ch for ch in args.pair_code if ch.isdigit())
    if args.pair_code and len(phone) < 7:
        print(f"error: --pair-code {args.pair_code!r}: expected a phone number in international format", file=sys.stderr)
        return 2
    account = whatsapp_requests.ask_link(ctx.paths, instance, phone, args.timeout, _show)
    print(f"Linked {instance} as +{account}. The gateway connects within seconds (`starling status` shows it).")
    return 0


def cmd_unlink(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    instance = _instance(ctx, args.instance)
    print(whatsapp_requests.ask_unlink(ctx.paths, instance))
    return 0
