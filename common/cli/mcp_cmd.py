"""`starling mcp serve`: Starling's read-only MCP server (common/mcp_server.py) on stdin/stdout, for desktop
clients and editors that start it as a subprocess. Stdout is the protocol: logs go to stderr."""

from __future__ import annotations

import argparse

from common.cli.context import Context
from common.secrets import register_known_secrets


def register(verbs) -> None:
    mcp = verbs.add_parser("mcp", help="Starling as an MCP server (read-only)")
    actions = mcp.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = actions.add_parser(
        "serve", help="serve the read-only MCP tools on stdio (recall, sessions, cron, agents, usage)",
        description="Speaks MCP on stdin/stdout until stdin closes: recall_search, sessions_list, session_show,"
                    " cron_list, agents_list and usage, read-only, every secret value redacted. Over HTTP the"
                    " same tools are at /mcp on the control address, behind the control token.")
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    register_known_secrets(ctx.paths, ctx.cfg)  # before the first answer: every value known is redacted
    from common.mcp_server import build  # the SDK: imported only to serve

    build(ctx.paths, ctx.cfg).run("stdio")
    return 0
