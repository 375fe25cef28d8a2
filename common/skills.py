"""An approved skill in its persona pack: agents/<id>/skills/<name>/SKILL.md written and its name listed in
skills.toml. Each file is copied to data/backups/agents/<id>/<YYYY-MM-DD-HHMMSS>-<file> (0600) before it is
changed, as the memory tools do for MEMORY.md and USER.md, under the same lock (agents/<id>/.memory.lock),
and replaced atomically. skills.toml keeps its comments: only its ``skills = [...]`` list is rewritten."""

from __future__ import annotations

import fcntl
import os
import re
import time
import tomllib
from pathlib import Path

from common.errors import StarlingError
from common.home import FILE_MODE, Paths, make_private_dir, write_private_file
from common.personas import SKILLS_DIR, load_skills_file

_LIST = re.compile(r"^skills\s*=\s*\[[^\]]*\]", re.M)
SKILLS_FILE_HEAD = "# Skills this agent may use: names of folders under skills/, each holding a SKILL.md.\n"


def skill_text(name: str, description: str, body: str) -> str:
    """A SKILL.md: front matter (its description is what the system prompt offers), then the instructions."""
    return f"---\nname: {name}\ndescription: {description}\n---\n\n{body.strip()}\n"


def install(paths: Paths, agent: str, name: str, description: str, body: str) -> tuple[Path, list[Path]]:
    """Write the skill into ``agent``'s pack and list it; (its SKILL.md, the backups made)."""
    pack = paths.agents_dir / agent
    if not pack.is_dir():
        raise StarlingError(f"agent {agent!r} has no persona pack at {pack}")
    backups: list[Path] = []
    fd = os.open(pack / ".memory.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        listed = load_skills_file(pack).skills  # a broken skills.toml is reported before anything changes
        folder = pack / SKILLS_DIR / name
        make_private_dir(folder)
        skill_file = folder / "SKILL.md"
        if skill_file.is_file():
            backups.append(backup(paths, agent, skill_file, f"skill-{name}.md"))
        write_private_file(skill_file, skill_text(name, description, body).encode("utf-8"))
        if name not in listed:
            toml = pack / "skills.toml"
            if toml.is_file():
                backups.append(backup(paths, agent, toml, "skills.toml"))
            write_private_file(toml, with_skill(toml.read_text("utf-8") if toml.is_file() else "", [*listed, name]))
    finally:
        os.close(fd)
    return skill_file, backups


def with_skill(text: str, names: list[str]) -> bytes:
    """skills.toml's text with its list set to ``names`` (comments and layout kept where there was a list)."""
    line = "skills = [" + ", ".join(f'"{n}"' for n in names) + "]"
    if _LIST.search(text):
        new = _LIST.sub(line, text, count=1)
    else:
        new = (text or SKILLS_FILE_HEAD).rstrip("\n") + "\n" + line + "\n"
    if tomllib.loads(new).get("skills") != names:  # an odd layout the pattern misread: write it plainly
        new = SKILLS_FILE_HEAD + line + "\n"
    return new.encode("utf-8")


def backup(paths: Paths, agent: str, path: Path, name: str) -> Path:
    """Copy ``path`` to data/backups/agents/<agent>/<stamp>-<name> (a second copy in the same second: -2, -3 ...)."""
    folder = paths.backups_dir / agent
    make_private_dir(folder)
    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    stem, dot, ext = name.rpartition(".")
    target, n = folder / f"{stamp}-{name}", 2
    while target.exists():
        target = folder / f"{stamp}-{stem}-{n}{dot}{ext}"
        n += 1
    write_private_file(target, path.read_bytes())
    return target
