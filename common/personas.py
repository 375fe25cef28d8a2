"""Persona packs: an agent's folder of Markdown and TOML files, created from defaults or copied, and listed;
the schema of a pack's config.toml and skills.toml, and their validation (the runner and doctor share it)."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path

import msgspec

from common.config import ID_PATTERN
from common.errors import ConfigError, StarlingError
from common.home import Paths, fsync_dir, make_private_dir, write_private_file

_ID = re.compile(ID_PATTERN)

PACK_FILES = ("IDENTITY.md", "SOUL.md", "USER.md", "AGENTS.md", "MEMORY.md", "config.toml", "skills.toml")
SKILLS_DIR = "skills"
SCRATCHPAD = ".scratchpad"
FRESH_ON_COPY = ("MEMORY.md",)  # an agent's memories are its own: a copy starts with an empty one

DEFAULT_TOOLS = ("files", "shell", "memory", "recall", "send", "cron", "jobs", "web", "skills")  # every group
APPROVAL_MODES = ("ask", "auto", "deny")
MAX_APPROVAL_TTL_S = 7 * 86400


class Approval(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    mode: str = "ask"  # ask | auto (never ask: for trusted, sandboxed setups) | deny (refuse what would ask)
    ttl_s: float = 24 * 3600.0  # how long a question waits for the person before it expires (at most 7 days)


class AgentSettings(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """agents/<id>/config.toml."""

    provider: str = "default"
    model: str = ""
    tools: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_TOOLS))
    approval: Approval = msgspec.field(default_factory=Approval)
    max_steps: int = 12  # model calls in one turn before it is cut short
    # domains web_fetch reaches without asking (each with its subdomains: "example.org" covers "docs.example.org")
    web_allow: list[str] = msgspec.field(default_factory=list)
    mcp: list[str] = msgspec.field(default_factory=list)  # [mcp.<name>] servers of config.toml this agent may use


class SkillsFile(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """agents/<id>/skills.toml."""

    skills: list[str] = []


def load_settings(folder: Path) -> AgentSettings:
    """A pack's config.toml (defaults when absent); ConfigError names the file, the key and what was expected."""
    path = Path(folder) / "config.toml"
    settings = decode_toml(path, AgentSettings) or AgentSettings()
    if settings.approval.mode not in APPROVAL_MODES:
        raise ConfigError(path, "approval.mode", f"expected ask, auto or deny, got {settings.approval.mode!r}")
    if not 0 < settings.approval.ttl_s <= MAX_APPROVAL_TTL_S:
        raise ConfigError(path, "approval.ttl_s",
                          f"expected seconds in (0, {MAX_APPROVAL_TTL_S}], got {settings.approval.ttl_s!r}")
    return settings


def load_skills_file(folder: Path) -> SkillsFile:
    """A pack's skills.toml (none when absent); ConfigError like load_settings."""
    return decode_toml(Path(folder) / "skills.toml", SkillsFile) or SkillsFile()


def decode_toml(path: Path, type_):
    """The TOML file at ``path`` as ``type_``; None when there is no file."""
    if not path.exists():
        return None
    try:
        return msgspec.convert(tomllib.loads(path.read_text(encoding="utf-8")), type=type_)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "-", f"not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(path, "-", "not UTF-8 text") from None
    except msgspec.ValidationError as exc:
        key, reason = _explain(str(exc), type_)
        raise ConfigError(path, key, reason) from None


def _explain(message: str, type_) -> tuple[str, str]:
    """msgspec's "... - at `$.a.b`" as a dotted key and a reason that says what was expected."""
    text, _, at = message.partition(" - at ")
    parts = [p for p in at.strip("`").removeprefix("$").split(".") if p]
    struct = type_
    for part in parts:  # the struct the failing key sits in, for the list of keys it takes
        hint = msgspec.structs.fields(struct) if isinstance(struct, type) else ()
        struct = next((f.type for f in hint if f.name == part), None)
    unknown = re.match(r"Object contains unknown field `(.*)`$", text)
    if unknown:
        known = [f.name for f in msgspec.structs.fields(struct)] if isinstance(struct, type) else []
        return ".".join([*parts, unknown[1]]), "unknown key" + (f"; expected one of: {', '.join(known)}" if known else "")
    return ".".join(parts) or "-", text[:1].lower() + text[1:]


@dataclass(frozen=True)
class PackInfo:
    id: str
    path: Path
    files: list[str]  # which of PACK_FILES are present
    missing: list[str]  # which are not
    skills: list[str]  # folders under skills/ that hold a SKILL.md


def default_files(agent_id: str) -> dict[str, str]:
    """The text of each file of a new pack, for agent ``agent_id``."""
    tools = ", ".join(f'"{t}"' for t in DEFAULT_TOOLS)
    return {
        "IDENTITY.md": f"""\
# Identity

- Name: {agent_id}
- Role: a personal assistant that helps its person get things done: answers questions, keeps
  notes and reminders, and uses its tools on their behalf.
""",
        "SOUL.md": """\
# Soul

- Be warm, direct and brief. Lead with the answer; offer details when they are wanted.
- Be honest: say what you do not know, and never pretend a tool ran when it did not.
- Respect your person's time, privacy and decisions.
""",
        "USER.md": """\
# User

What you know about your person. Fill it in, or let the agent add to it as it learns.

- Name:
- Time zone:
- Preferences:
""",
        "AGENTS.md": """\
# Operating rules

- Ask before anything dangerous: deleting or overwriting files, running commands that change the
  system, sending messages to anyone else, spending money. Say what you will do and why.
- Work in your private workspace; use the shared workspace only for what others should see.
- Keep secrets secret: never repeat tokens, passwords or keys, not even back to your person.
- Write down what you should remember in MEMORY.md, briefly.
- When a task will take a while, say so, and report when it is done.
""",
        "MEMORY.md": """\
# Memory
""",
        "config.toml": f"""\
# Settings of this agent.

provider = "default"           # a [providers.<name>] of the main config.toml
model = ""                     # "" = the provider's model
tools = [{tools}]
mcp = []                       # MCP servers of the main config.toml ([mcp.<name>]) this agent may use
web_allow = []                 # domains web_fetch reads without asking (subdomains included), e.g. ["python.org"]

[approval]
mode = "ask"                   # ask the person before dangerous tool calls
""",
        "skills.toml": """\
# Skills this agent may use: names of folders under skills/, each holding a SKILL.md.
skills = []
""",
    }


def _check_id(agent_id: str) -> None:
    if not _ID.match(agent_id):
        raise StarlingError(
            f"invalid agent id {agent_id!r}: expected 1-32 characters of a-z 0-9 _ -, starting with a letter or digit"
        )




def _copy_private(source: Path, target: Path) -> None:
    """Copy a pack's tree: folders 0700, files 0600; symlinks are not followed (skipped)."""
    for entry in sorted(source.iterdir()):
        if entry.is_symlink():
            continue
        dest = target / entry.name
        if entry.is_dir():
            make_private_dir(dest)
            _copy_private(entry, dest)
        elif entry.is_file():
            write_private_file(dest, entry.read_bytes())


def create_pack(paths: Paths, agent_id: str, copy_from: str | None = None) -> Path:
    """Create agents/<id>/ (defaults, or a copy of pack ``copy_from`` with a fresh MEMORY.md) and the
    agent's private workspace; refuse an existing agent. The pack appears whole or not at all."""
    _check_id(agent_id)
    target = paths.agents_dir / agent_id
    if target.exists():
        raise StarlingError(f"agent {agent_id!r} already exists at {target}")
    source = None
    if copy_from is not None:
        _check_id(copy_from)
        source = paths.agents_dir / copy_from
        if not source.is_dir():
            raise StarlingError(f"no agent {copy_from!r} to copy from ({source} does not exist)")
    make_private_dir(paths.agents_dir)
    building = paths.agents_dir / f".{agent_id}.{secrets.token_hex(4)}.new"
    make_private_dir(building)
    try:
        if source is not None:
            _copy_private(source, building)
            fresh = default_files(agent_id)
            for name in FRESH_ON_COPY:
                write_private_file(building / name, fresh[name].encode())
        else:
            for name, text in default_files(agent_id).items():
                write_private_file(building / name, text.encode())
        make_private_dir(building / SKILLS_DIR)
        try:
            os.rename(building, target)  # fails if another process created it meanwhile
        except OSError:
            raise StarlingError(f"agent {agent_id!r} already exists at {target}") from None
        fsync_dir(paths.agents_dir)  # the rename survives a power cut
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)
    private = paths.private_workspace(agent_id)
    make_private_dir(private)
    make_private_dir(private / SCRATCHPAD)
    return target


def list_packs(paths: Paths) -> list[PackInfo]:
    """Every agent folder under agents_dir (names that are valid ids), sorted by id."""
    if not paths.agents_dir.is_dir():
        return []
    packs = []
    for entry in sorted(paths.agents_dir.iterdir()):
        if not entry.is_dir() or not _ID.match(entry.name):
            continue
        present = [name for name in PACK_FILES if (entry / name).is_file()]
        skills_dir = entry / SKILLS_DIR
        skills = sorted(
            d.name for d in skills_dir.iterdir() if (d / "SKILL.md").is_file()
        ) if skills_dir.is_dir() else []
        packs.append(PackInfo(entry.name, entry, present, [n for n in PACK_FILES if n not in present], skills))
    return packs
