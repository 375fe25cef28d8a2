"""`starling [--home PATH] VERB`: the parser, the dispatch, and the mapping of errors to exit codes.

Exit codes: 0 ok, 1 failure, 2 usage, 3 `status` with something expected not running. Each verb module
has ``register(subparsers)`` that adds its verbs with ``func=`` set to a function taking the parsed args
and returning an exit code. ``--home`` is accepted before the verb and after it (``starling status
--home X``); a closed pipe (``| head``) ends the command quietly, and an OS error is one line, never a
traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata

from common.cli import output
from common.errors import StarlingError

VERB_MODULES = (
    "common.cli.init_cmd",
    "common.cli.service_cmd",
    "common.cli.lifecycle_cmd",
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
    "common.cli.skills_cmd",
    "common.cli.whatsapp_cmd",
    "common.cli.dashboard_cmd",
    "common.cli.retention_cmd",
    "common.cli.mcp_cmd",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # usage errors exit 2, as documented
        self.print_usage(sys.stderr)
        output.error(message)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="starling", description="Starling: a self-hosted AI agent daemon.")
    parser.add_argument("--home", help=HOME_HELP)
    parser.add_argument("--version", action="version", version=f"starling {version()}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    verbs.required = True
    import importlib

    for name in VERB_MODULES:
        importlib.import_module(name).register(verbs)
    _home_after_the_verb(verbs)
    return parser


HOME_HELP = "the Starling home (default: $STARLING_HOME or ./.starling)"


def version() -> str:
    try:
        return metadata.version("starling")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _home_after_the_verb(action: argparse._SubParsersAction) -> None:
    """Every verb (and sub-verb) takes --home too; given there, it wins over one given before the verb
    (SUPPRESS: absent, it leaves the value before the verb alone)."""
    for sub in action.choices.values():
        if not any("--home" in a.option_strings for a in sub._actions):
            sub.add_argument("--home", default=argparse.SUPPRESS, help=HOME_HELP)
        for inner in sub._actions:
            if isinstance(inner, argparse._SubParsersAction):
                _home_after_the_verb(inner)


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
    except BrokenPipeError:  # `starling … | head`: the reader is gone; stop quietly, at exit too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a path that is a file, a folder not allowed: one line, no traceback
        where = f": {exc.filename}" if exc.filename else ""
        output.error(f"{exc.strerror or exc}{where}")
        return 1


def run() -> None:
    sys.exit(main())
