"""`starling [--home PATH] VERB`: the parser, the dispatch, and the mapping of errors to exit codes.

Exit codes: 0 ok, 1 failure, 2 usage. Each verb module has ``register(subparsers)`` that adds its
verbs with ``func=`` set to a function taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import sys

from common.cli import output
from common.errors import StarlingError

VERB_MODULES = (
    "common.cli.init_cmd",
    "common.cli.service_cmd",
    "common.cli.logs_cmd",
    "common.cli.secret_cmd",
    "common.cli.doctor_cmd",
    "common.cli.session_cmd",
    "common.cli.data_cmd",
    "common.cli.backup_cmd",
    "common.cli.agent_cmd",
    "common.cli.chat_cmd",
    "common.cli.approvals_cmd",
    "common.cli.pairing_cmd",
    "common.cli.cron_cmd",
    "common.cli.whatsapp_cmd",
    "common.cli.mcp_cmd",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 2, as documented
        self.print_usage(sys.stderr)
        output.error(message)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="starling", description="Starling: a self-hosted AI agent daemon.")
    parser.add_argument("--home", help="the Starling home (default: $STARLING_HOME or ./.starling)")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    verbs.required = True
    import importlib

    for name in VERB_MODULES:
        importlib.import_module(name).register(verbs)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except StarlingError as exc:
        output.error(str(exc))
        return 1
    except KeyboardInterrupt:
        return 130


def run() -> None:
    sys.exit(main())
