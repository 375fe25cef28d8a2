"""`starling skills drafts|show|approve|reject|unused`: the skills agents proposed (skill_draft), and the
skills no turn has loaded lately.

approve writes agents/<id>/skills/<name>/SKILL.md and lists the name in skills.toml (dated backups first,
common/skills.py), then marks the draft accepted through the writer; reject marks it rejected. unused reads
the tool audit (skill_load calls), which is kept `[retention] audit_days`: that is the window it can speak for.
"""

from __future__ import annotations

import argparse
import time

from common import db
from common.cli import output
from common.cli.context import Context
from common.errors import StarlingError, WriteRejected
from common.personas import list_packs, load_skills_file
from common.skills import install
from common.stores import skill_store
from schema import messages as m

DAY = 86400.0


def register(verbs) -> None:
    skills = verbs.add_parser("skills", help="skills the agents proposed (approve, reject) and skills nobody loads")
    sub = skills.add_subparsers(dest="skills_verb", metavar="VERB")
    drafts = sub.add_parser("drafts", help="the drafts waiting for a decision: id, agent, name, description, age")
    drafts.add_argument("--json", action="store_true", help="machine-readable output")
    drafts.set_defaults(func=cmd_drafts)
    show = sub.add_parser("show", help="a draft's description and text, to read before approving it")
    show.add_argument("name")
    show.add_argument("--agent", help="the agent whose draft (when several agents have one of that name)")
    show.set_defaults(func=cmd_show)
    approve = sub.add_parser("approve", help="install a draft: agents/<id>/skills/<name>/SKILL.md, listed in"
                                             " skills.toml (dated backups in data/backups/agents/<id>/)")
    approve.add_argument("name")
    approve.add_argument("--agent", help="the agent whose draft (when several agents have one of that name)")
    approve.set_defaults(func=cmd_approve)
    reject = sub.add_parser("reject", help="drop a draft (it stays in the database, marked rejected)")
    reject.add_argument("name")
    reject.add_argument("--agent", help="the agent whose draft (when several agents have one of that name)")
    reject.set_defaults(func=cmd_reject)
    unused = sub.add_parser("unused", help="skills listed in skills.toml that no turn loaded within the audit"
                                           " window ([retention] audit_days)")
    unused.add_argument("--agent", help="only this agent's skills")
    unused.add_argument("--json", action="store_true", help="machine-readable output")
    unused.set_defaults(func=cmd_unused)
    skills.set_defaults(func=cmd_drafts, json=False)


def _read(ctx: Context, fn, *args):
    conn = ctx.reader()
    try:
        with db.read_tx(conn):
            return fn(conn, *args)
    finally:
        conn.close()


def cmd_drafts(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    rows = _read(ctx, skill_store.drafts)
    now = time.time()
    listed = [{"id": d.id, "agent": d.agent, "name": d.name, "description": d.description,
               "age_s": round(now - d.created_at), "replaces": (ctx.paths.agents_dir / d.agent / "skills" / d.name
                                                               / "SKILL.md").is_file()} for d in rows]
    if getattr(args, "json", False):
        output.emit_json(listed)
        return 0
    if not listed:
        print("No skill drafts waiting.")
        return 0
    print(output.table(["ID", "AGENT", "NAME", "DESCRIPTION", "PROPOSED"],
                       [[r["id"], r["agent"], r["name"] + (" (replaces the installed one)" if r["replaces"] else ""),
                         r["description"][:80], output.duration(r["age_s"]) + " ago"] for r in listed]))
    print("\nRead one with `starling skills show NAME`; then `starling skills approve NAME` or `reject NAME`.")
    return 0


def _draft(ctx: Context, name: str, agent: str | None) -> skill_store.Draft:
    found = [d for d in _read(ctx, skill_store.drafts_named, name) if agent in (None, d.agent)]
    if not found:
        who = f" of agent {agent!r}" if agent else ""
        raise StarlingError(f"no skill draft named {name!r}{who} is waiting (see `starling skills drafts`)")
    agents = sorted({d.agent for d in found})
    if len(agents) > 1:
        raise StarlingError(f"agents {', '.join(agents)} each have a draft named {name!r}: say which with --agent")
    return found[-1]


def cmd_show(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    draft = _draft(ctx, args.name, args.agent)
    print(f"Skill draft #{draft.id} {draft.name!r} of agent {draft.agent!r}\nDescription: {draft.description}\n")
    print(draft.body)
    return 0


def _decide(ctx: Context, draft: skill_store.Draft, state: str) -> None:
    try:
        ctx.call(m.DecideSkillDraft(id=draft.id, state=state))
    except WriteRejected as exc:
        raise StarlingError(f"skill draft {draft.name!r}: {str(exc).split(': ', 1)[-1]}") from None


def cmd_approve(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    draft = _draft(ctx, args.name, args.agent)
    skill_file, backups = install(ctx.paths, draft.agent, draft.name, draft.description, draft.body)
    shown = skill_file.relative_to(ctx.paths.agents_dir.parent) if ctx.paths.agents_dir.parent in skill_file.parents \
        else skill_file
    try:
        _decide(ctx, draft, "accepted")
    except StarlingError as exc:
        raise StarlingError(f"{shown} is written and listed, but the draft could not be marked approved ({exc});"
                            " run the same command again once Starling is up") from None
    print(f"Approved {draft.name!r} for agent {draft.agent!r}: {shown}, listed in skills.toml; the agent is offered"
          " it from its next turn.")
    for copy in backups:
        print(f"The previous version is kept as {copy}")
    return 0


def cmd_reject(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    draft = _draft(ctx, args.name, args.agent)
    _decide(ctx, draft, "rejected")
    print(f"Rejected the draft {draft.name!r} of agent {draft.agent!r}.")
    return 0


def cmd_unused(args: argparse.Namespace) -> int:
    ctx = Context.from_args(args)
    days = ctx.cfg.retention.audit_days
    now = time.time()
    loaded = _read(ctx, skill_store.loaded_since, now - days * DAY)
    oldest = _read(ctx, skill_store.oldest_audit)
    unused = []
    for pack in list_packs(ctx.paths):
        if args.agent and pack.id != args.agent:
            continue
        for name in load_skills_file(pack.path).skills:
            if (pack.path / "skills" / name / "SKILL.md").is_file() and (pack.id, name) not in loaded:
                unused.append({"agent": pack.id, "skill": name})
    span = f"the last {days} days ([retention] audit_days: the audit of skill_load calls is kept no longer)"
    if getattr(args, "json", False):
        output.emit_json({"audit_days": days, "unused": unused,
                          "audit_since": oldest})
        return 0
    if not unused:
        print(f"Every listed skill was loaded at least once in {span}.")
        return 0
    print(f"Skills no turn loaded in {span}:")
    print(output.table(["AGENT", "SKILL"], [[u["agent"], u["skill"]] for u in unused]))
    if oldest is None or now - oldest < days * DAY:
        since = "no audit rows yet" if oldest is None else f"the audit holds {output.duration(now - oldest)} so far"
        print(f"\n(Fewer than {days} days to judge by: {since}.)")
    return 0
