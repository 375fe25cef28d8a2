"""The skills tool: an agent proposes a skill of its own (``skill_draft``), kept as a draft until the operator
approves it (`starling skills approve NAME`: it becomes agents/<id>/skills/<name>/SKILL.md, listed in
skills.toml) or rejects it. A draft never changes the persona pack by itself."""

from __future__ import annotations

import re
from typing import Any

from schema import messages as m
from services.runner.llm import ToolSpec
from services.runner.tools.base import Tool, ToolContext, ToolError, ToolResult

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
MAX_DESCRIPTION = 300
MAX_TEXT = 64 * 1024  # what skill_load gives back at most (persona.FILE_LIMIT)


async def skill_draft(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    name = args["name"].strip().lower()
    description = " ".join(args["description"].split())
    text = args["text"].strip()
    if not NAME.match(name):
        raise ToolError(f"{args['name']!r} is not a skill name: 1-64 characters of a-z 0-9 _ -, starting with a"
                        " letter or digit (it becomes the skill's folder name)")
    if not description or len(description) > MAX_DESCRIPTION:
        raise ToolError(f"the description is the one line the system prompt shows: 1-{MAX_DESCRIPTION} characters")
    if not text or len(text.encode("utf-8")) > MAX_TEXT:
        raise ToolError(f"the text is the skill's instructions: 1 byte to {MAX_TEXT // 1024} KB")
    result = await ctx.call(m.DraftSkill(agent=ctx.agent, name=name, description=description, body=text,
                                         session_id=ctx.session_id, turn_id=ctx.turn_id, worker=ctx.worker))
    draft_id = getattr(result, "id", 0)
    return ToolResult(f"Skill draft {name!r} saved (#{draft_id}). It is not in use yet: the operator reviews it and"
                      f" approves it with `starling skills approve {name}` (or rejects it).")


TOOLS = [
    Tool(ToolSpec("skill_draft", "Propose a new skill for yourself: reusable instructions for a kind of task you"
                  " expect to meet again. It is saved as a draft for the operator to approve; once approved it is"
                  " offered in your system prompt and loaded with skill_load. Proposing the same name again"
                  " replaces the draft.",
                  {"type": "object", "properties": {
                      "name": {"type": "string", "description": "a short id: a-z 0-9 _ - (e.g. 'weekly-report')"},
                      "description": {"type": "string", "description": "one line: when to use it"},
                      "text": {"type": "string", "description": "the instructions, in Markdown"}},
                   "required": ["name", "description", "text"], "additionalProperties": False}),
         "skills", skill_draft),
]
