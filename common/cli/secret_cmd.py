"""`starling secret [list | set NAME | rm NAME]`: secret names, where they resolve, and who uses them; never a value."""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from common.cli import output
from common.cli.context import Context
from common.config import referenced_secrets
from common.errors import StarlingError
from common.home import ensure_layout
from common.secrets import env_names, list_secrets, remove_secret, set_secret

SOURCE_TEXT = {"env": "env", "file": "secrets.json", "missing": "missing"}


def register(verbs) -> None:
    secret = verbs.add_parser(
        "secret", help="list secret names (never values); set or remove one",
        description="Config holds secret names; a name resolves from the environment ($NAME, then "
                    "$STARLING_SECRET_NAME) or data/secrets.json. Environment wins.",
    )
    secret.add_argument("--json", action="store_true", help="print JSON for scripts")
    secret.set_defaults(func=cmd_list)
    actions = secret.add_subparsers(dest="action", metavar="ACTION")
    listing = actions.add_parser("list", help="the same listing as `starling secret`: names, where set, used by")
    listing.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts")
    listing.set_defaults(func=cmd_list)
    put = actions.add_parser("set", help="store a secret in data/secrets.json (0600)")
    put.add_argument("name", metavar="NAME", help="the secret's name, as config.toml refers to it")
    source = put.add_mutually_exclusive_group(required=True)
    source.add_argument("--value-stdin", action="store_true",
                        help="read the value from stdin (one trailing newline is dropped); at a terminal, one"
                             " line, not echoed")
    source.add_argument("--value", metavar="V", help="the value itself (it lands in your shell history)")
    put.set_defaults(func=cmd_set)
    rm = actions.add_parser("rm", help="remove a secret from data/secrets.json")
    rm.add_argument("name", metavar="NAME")
    rm.set_defaults(func=cmd_rm)


def cmd_list(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    used = referenced_secrets(ctx.cfg)
    infos = list_secrets(ctx.paths.secrets_file, used)
    rows = [{"name": i.name, "source": i.source, "referenced_by": used.get(i.name, "")} for i in infos]
    if args.json:
        output.emit_json(rows)
        return 0
    if not rows:
        print("no secrets referenced or stored")
        return 0
    print(output.table(("NAME", "SET IN", "USED BY"),
                       [(r["name"], SOURCE_TEXT[r["source"]], r["referenced_by"] or "-") for r in rows]))
    missing = [r["name"] for r in rows if r["source"] == "missing"]
    if missing:
        print()
        output.warn(f"{len(missing)} not set: {', '.join(missing)}; "
                    "set each with `starling secret set NAME --value-stdin`")
    return 0


def _read_stdin() -> str:
    value = sys.stdin.read()
    if value.endswith("\r\n"):
        return value[:-2]
    return value.removesuffix("\n")


def cmd_set(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    if args.value_stdin:
        if sys.stdin.isatty():  # typed or pasted: never echoed, never left on the screen
            value = getpass.getpass(f"value for {args.name} (not shown): ")
        else:
            value = _read_stdin()
    else:
        value = args.value
        output.warn("--value puts the secret in your shell history and the process list;"
                    " prefer --value-stdin")
    if not value:
        raise StarlingError(f"secret {args.name!r}: refusing to store an empty value")
    ensure_layout(ctx.paths)  # data_dir may not exist yet (a config written by hand)
    set_secret(ctx.paths.secrets_file, args.name, value)
    print(f"stored secret {args.name!r} in {ctx.paths.secrets_file}")
    _warn_env_shadow(args.name)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    if not remove_secret(ctx.paths.secrets_file, args.name):
        raise StarlingError(f"no secret {args.name!r} in {ctx.paths.secrets_file}")
    print(f"removed secret {args.name!r} from {ctx.paths.secrets_file}")
    _warn_env_shadow(args.name)
    used = referenced_secrets(ctx.cfg).get(args.name)
    if used:
        output.warn(f"config key {used} still refers to {args.name!r}")
    return 0


def _warn_env_shadow(name: str) -> None:
    for var in env_names(name):
        if os.environ.get(var):
            output.warn(f"${var} is set in this environment and wins over secrets.json")
            return
