"""The memory tools: an agent reads and edits its own MEMORY.md and USER.md (agents/<id>/), with backups.

Before every edit the current file is copied to data/backups/agents/<agent>/<YYYY-MM-DD-HHMMSS>-<FILE>.md
(0600; a second edit in the same second gets -2, -3, …). Edits are read-modify-write under an flock on
agents/<id>/.memory.lock, so two runners editing one agent's memory do not lose each other's changes,
and the new text replaces the file atomically (0600). A file may not grow past MAX_BYTES.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from common.config import ID_PATTERN
from common.home import FILE_MODE, make_private_dir, write_private_file
from services.runner.llm import ToolSpec
from services.runner.tools.base import Tool, ToolContext, ToolError, ToolResult

FILES = {"MEMORY": "MEMORY.md", "USER": "USER.md"}
MAX_BYTES = 64 * 1024
MAX_NAME = 80
MAX_NOTE = 1000
PEOPLE = "## People"
_ID = re.compile(ID_PATTERN)


def _pack(ctx: ToolContext) -> Path:
    if not _ID.match(ctx.agent):
        raise ToolError(f"invalid agent id {ctx.agent!r}")
    folder = ctx.paths.agents_dir / ctx.agent
    if not folder.is_dir():
        raise ToolError(f"the persona folder of agent {ctx.agent!r} does not exist")
    return folder


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder / ".memory.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _read(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_BYTES * 4).decode("utf-8", "replace")


def backup(ctx: ToolContext, path: Path) -> Path | None:
    """Copy the file as it is now to data/backups/agents/<agent>/; None when there is nothing to copy."""
    if not path.is_file():
        return None
    folder = ctx.paths.backups_dir / ctx.agent
    make_private_dir(folder)  # a new folder is durable before the copy goes in
    stamp = time.strftime("%Y-%m-%d-%H%M%S", time.gmtime())
    stem = path.name.removesuffix(".md")
    target = folder / f"{stamp}-{stem}.md"
    n = 2
    while target.exists():
        target = folder / f"{stamp}-{stem}-{n}.md"
        n += 1
    write_private_file(target, path.read_bytes())
    return target


def _edit(ctx: ToolContext, file_key: str, change) -> tuple[int, Path | None]:
    """Apply change(old text) -> new text to one file, with a backup first; (new size, backup path)."""
    folder = _pack(ctx)
    path = folder / FILES[file_key]
    with _locked(folder):
        old = _read(path)
        new = change(old)
        size = len(new.encode("utf-8"))
        if size > MAX_BYTES:
            raise ToolError(f"{FILES[file_key]} would be {size} bytes, over its {MAX_BYTES // 1024} KB limit;"
                            " shorten it (replace it with a condensed version) first")
        copy = backup(ctx, path)
        write_private_file(path, new.encode("utf-8"))
    return size, copy


async def memory_read(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    path = _pack(ctx) / FILES[args["file"]]
    text = await asyncio.to_thread(_read, path)
    return ToolResult(text if text.strip() else f"({FILES[args['file']]} is empty)")


async def memory_edit(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    file_key, mode, text = args["file"], args["mode"], args["text"]
    old_passage = args.get("old")

    def change(current: str) -> str:
        if mode == "append":
            sep = "" if not current or current.endswith("\n") else "\n"
            return current + sep + text + ("" if text.endswith("\n") else "\n")
        if old_passage is None:
            return text if text.endswith("\n") or not text else text + "\n"
        count = current.count(old_passage)
        if count != 1:
            raise ToolError(f"the passage to replace occurs {count} times in {FILES[file_key]}; it must occur"
                            " exactly once (quote more of it)")
        return current.replace(old_passage, text, 1)

    if mode == "append" and old_passage is not None:
        return ToolResult("'old' goes with mode=replace only", outcome="error")
    size, copy = await asyncio.to_thread(_edit, ctx, file_key, change)
    saved = f"; the previous version is kept as {copy.name}" if copy else ""
    return ToolResult(f"{FILES[file_key]} updated ({size} bytes){saved}")


def add_person_note(text: str, name: str, note: str) -> str:
    """USER.md text with ``- note`` added under ``### name`` of the ``## People`` section (both made if absent)."""
    lines = text.split("\n") if text else []
    if lines and lines[-1] == "":
        lines.pop()
    start = next((i for i, line in enumerate(lines) if line.strip() == PEOPLE), None)
    if start is None:
        if lines and lines[-1].strip():
            lines.append("")
        lines += [PEOPLE, "", f"### {name}", f"- {note}"]
        return "\n".join(lines) + "\n"
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^#{1,2} ", lines[i])), len(lines))
    person = next((i for i in range(start + 1, end)
                   if lines[i].startswith("### ") and lines[i][4:].strip().casefold() == name.casefold()), None)
    if person is None:
        at = end
        while at > start + 1 and not lines[at - 1].strip():
            at -= 1
        block = ["", f"### {name}", f"- {note}"]
        if end < len(lines) and at == end:  # keep a blank line before the next section
            block.append("")
        lines[at:at] = block
        return "\n".join(lines) + "\n"
    stop = next((i for i in range(person + 1, end) if lines[i].startswith("#")), end)
    at = stop
    while at > person + 1 and not lines[at - 1].strip():
        at -= 1
    lines.insert(at, f"- {note}")
    return "\n".join(lines) + "\n"


async def people_note(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    name = " ".join(args["name"].split()).lstrip("#").strip()
    note = " ".join(args["note"].split())
    if not name or len(name) > MAX_NAME:
        return ToolResult(f"the name must be 1-{MAX_NAME} characters", outcome="error")
    if not note or len(note) > MAX_NOTE:
        return ToolResult(f"the note must be 1-{MAX_NOTE} characters", outcome="error")
    size, copy = await asyncio.to_thread(_edit, ctx, "USER", lambda text: add_person_note(text, name, note))
    saved = f"; the previous version is kept as {copy.name}" if copy else ""
    return ToolResult(f"noted under {PEOPLE} / {name} in USER.md ({size} bytes){saved}")


_FILE = {"type": "string", "enum": list(FILES), "description": "MEMORY (your notes) or USER (about your person)"}

TOOLS = [
    Tool(ToolSpec("memory_read", "Read your MEMORY.md (what you chose to remember) or USER.md (about your person).",
                  {"type": "object", "properties": {"file": _FILE}, "required": ["file"],
                   "additionalProperties": False}),
         "memory", memory_read),
    Tool(ToolSpec("memory_edit",
                  "Edit MEMORY.md or USER.md: mode=append adds text at the end; mode=replace with `old` replaces"
                  " that exact passage (it must occur once), without `old` replaces the whole file. Keep them"
                  " brief: each file holds at most 64 KB. A dated backup is kept before every edit.",
                  {"type": "object", "properties": {
                      "file": _FILE,
                      "mode": {"type": "string", "enum": ["append", "replace"]},
                      "text": {"type": "string"},
                      "old": {"type": "string", "description": "replace mode: the passage to replace"},
                  }, "required": ["file", "mode", "text"], "additionalProperties": False}),
         "memory", memory_edit),
    Tool(ToolSpec("people_note",
                  "Remember something about a person in your person's life: adds '- note' under '### name' in"
                  " the '## People' section of USER.md.",
                  {"type": "object", "properties": {
                      "name": {"type": "string"},
                      "note": {"type": "string", "description": "one line"},
                  }, "required": ["name", "note"], "additionalProperties": False}),
         "memory", people_note),
]
