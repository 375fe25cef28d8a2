"""Persona packs as the runner uses them: an agent's settings, skills and system prompt, re-read on change.

The system prompt is assembled in this order (each file under its own heading, empty files left out):
IDENTITY.md, SOUL.md, AGENTS.md, USER.md, MEMORY.md, then the skills on offer (name and description;
the body is loaded on demand with the skill_load tool), then the conversation's summary when older
turns were compacted, then the time and the channel.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import StarlingError
from common.personas import AgentSettings, load_settings, load_skills_file

PROMPT_FILES = ("IDENTITY.md", "SOUL.md", "AGENTS.md", "USER.md", "MEMORY.md")
FILE_LIMIT = 64 * 1024  # bytes of one pack file taken into the prompt


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    path: Path


@dataclass
class Persona:
    agent: str
    folder: Path
    settings: AgentSettings
    sections: list[tuple[str, str]]  # (file name, text) of the prompt files, in prompt order
    skills: dict[str, Skill]
    stamp: tuple = field(default_factory=tuple)

    def system_prompt(self, summary: str = "", channel: str = "", now: float | None = None) -> str:
        parts = [f"<!-- {name} -->\n{text.strip()}" for name, text in self.sections if text.strip()]
        if self.skills:
            lines = [f"- {s.name}: {s.description}" for s in self.skills.values()]
            parts.append("# Skills\nLoad a skill's instructions with the skill_load tool when it fits the task.\n"
                         + "\n".join(lines))
        if summary:
            parts.append("# Earlier in this conversation (summary)\n" + summary.strip())
        when = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(now or time.time()))
        parts.append(f"# Now\nIt is {when}." + (f" You are talking through {channel}." if channel else ""))
        return "\n\n".join(parts)

    def skill_text(self, name: str) -> str | None:
        skill = self.skills.get(name)
        if skill is None:
            return None
        return skill.path.read_text(encoding="utf-8", errors="replace")[:FILE_LIMIT]


class Personas:
    """Loads persona packs and re-reads one when any of its files changed (by mtime and size)."""

    def __init__(self, agents_dir: Path) -> None:
        self.agents_dir = agents_dir
        self._cache: dict[str, Persona] = {}

    def get(self, agent: str) -> Persona:
        folder = self.agents_dir / agent
        stamp = _stamp(folder)
        cached = self._cache.get(agent)
        if cached is not None and cached.stamp == stamp:
            return cached
        persona = load(agent, folder)
        persona.stamp = stamp
        self._cache[agent] = persona
        return persona


def _stamp(folder: Path) -> tuple:
    entries = []
    for name in (*PROMPT_FILES, "config.toml", "skills.toml"):
        try:
            st = os.stat(folder / name)
            entries.append((name, st.st_mtime_ns, st.st_size))
        except FileNotFoundError:
            entries.append((name, 0, -1))
    skills = folder / "skills"
    if skills.is_dir():
        for skill in sorted(skills.glob("*/SKILL.md")):
            st = skill.stat()
            entries.append((str(skill), st.st_mtime_ns, st.st_size))
    return tuple(entries)


def load(agent: str, folder: Path) -> Persona:
    if not folder.is_dir():
        raise StarlingError(f"agent {agent!r} has no persona pack at {folder}; create it with `starling agent new {agent}`")
    settings = load_settings(folder)
    sections = []
    for name in PROMPT_FILES:
        path = folder / name
        text = path.read_text(encoding="utf-8", errors="replace")[:FILE_LIMIT] if path.exists() else ""
        sections.append((name, text))
    wanted = load_skills_file(folder).skills
    skills = {}
    for name in wanted:
        path = folder / "skills" / name / "SKILL.md"
        if path.exists():
            skills[name] = Skill(name, _description(path), path)
    return Persona(agent, folder, settings, sections, skills)


def _description(skill_file: Path) -> str:
    """The skill's one-line description: a `description:` front-matter line, else its first text line."""
    lines = skill_file.read_text(encoding="utf-8", errors="replace").splitlines()
    for line in lines[:20]:
        if line.lower().startswith("description:"):
            return line.split(":", 1)[1].strip()
    for line in lines:
        stripped = line.strip().lstrip("#").strip()
        if stripped and stripped != "---":
            return stripped[:200]
    return ""
