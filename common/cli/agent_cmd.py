"""`starling agent new ID [--from EXISTING]` and `starling agent list`: persona packs under agents_dir."""

from __future__ import annotations

import argparse

from common import personas
from common.cli import output
from common.cli.context import Context


def register(verbs) -> None:
    agent = verbs.add_parser("agent", help="create and list agents (persona packs)",
                             description="Agents are persona packs: folders of Markdown and TOML under agents_dir.")
    agent.set_defaults(func=cmd_list, json=False)
    actions = agent.add_subparsers(dest="action", metavar="ACTION")
    new = actions.add_parser("new", help="create an agent's persona pack and private workspace")
    new.add_argument("id", metavar="ID", help="the agent id (a-z 0-9 _ -, up to 32 characters)")
    new.add_argument("--from", dest="copy_from", metavar="EXISTING",
                     help="copy this agent's pack instead of the defaults (MEMORY.md starts empty)")
    new.set_defaults(func=cmd_new)
    listing = actions.add_parser("list", help="list agents, their files, and the gateways that use them")
    listing.add_argument("--json", action="store_true", help="print JSON for scripts")
    listing.set_defaults(func=cmd_list)


def cmd_new(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    path = personas.create_pack(ctx.paths, args.id, copy_from=args.copy_from)
    origin = f"a copy of {args.copy_from!r}" if args.copy_from else "the defaults"
    print(f"created agent {args.id!r} at {path} from {origin}")
    print(f"private workspace: {ctx.paths.private_workspace(args.id)}")
    print(f"edit {path / 'IDENTITY.md'} and {path / 'SOUL.md'} to shape it; point a gateway at it with"
          f' agent = "{args.id}" in {ctx.paths.config_file}')
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    used_by: dict[str, list[str]] = {}
    for gw in ctx.cfg.gateways.all():
        used_by.setdefault(gw.agent, []).append(gw.id)
    packs = personas.list_packs(ctx.paths)
    known = {p.id for p in packs}
    rows = [
        {
            "id": p.id,
            "path": str(p.path),
            "files": p.files,
            "missing": p.missing,
            "skills": p.skills,
            "gateways": used_by.get(p.id, []),
            "exists": True,
        }
        for p in packs
    ]
    # an agent a gateway names but that has no pack is worth seeing too
    for agent_id in sorted(set(used_by) - known):
        rows.append({"id": agent_id, "path": "", "files": [], "missing": list(personas.PACK_FILES), "skills": [],
                     "gateways": used_by[agent_id], "exists": False})
    if args.json:
        output.emit_json(rows)
        return 0
    if not rows:
        print(f"no agents in {ctx.paths.agents_dir}; create one with `starling agent new ID`")
        return 0
    table_rows = []
    for row in rows:
        if not row["exists"]:
            files = "missing (no pack)"
        elif row["missing"]:
            files = f"{len(row['files'])}/{len(personas.PACK_FILES)} (no {', '.join(row['missing'])})"
        else:
            files = f"{len(row['files'])}/{len(personas.PACK_FILES)}"
        table_rows.append((row["id"], row["path"] or "-", files, len(row["skills"]),
                           ", ".join(row["gateways"]) or "-"))
    print(output.table(("ID", "PATH", "FILES", "SKILLS", "GATEWAYS"), table_rows))
    return 0
