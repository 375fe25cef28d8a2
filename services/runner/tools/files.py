"""The file tools: file_read, file_write, file_list, file_search, confined by confine.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import sys
from typing import Any

from services.runner.llm import ToolSpec
from services.runner.tools import confine, search
from services.runner.tools.base import Tool, ToolContext, ToolError, ToolResult

MAX_READ_BYTES = 64 * 1024  # per file_read call; the model pages with offset/limit
DEFAULT_READ_LINES = 2000
MAX_WRITE_BYTES = 1024 * 1024
MAX_LIST_ENTRIES = 500
MAX_SEARCH_RESULTS = 100
SEARCH_TIMEOUT_S = 20.0
SNIFF = 8192


async def _in_thread(target: confine.Target, fn, *args) -> Any:
    """Run blocking file work off the event loop; an OSError becomes a short message naming the path."""
    try:
        return await asyncio.to_thread(fn, target, *args)
    except FileNotFoundError:
        raise ToolError(f"{target.shown}: no such file or folder") from None
    except OSError as e:
        raise ToolError(f"{target.shown}: {e.strerror or e}") from None


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------- file_read


def _read(target: confine.Target, offset: int, limit: int) -> ToolResult:
    fd, st = confine.open_read(target)
    with os.fdopen(fd, "rb") as f:
        if b"\x00" in f.read(SNIFF):
            return ToolResult(f"{target.shown} is a binary file ({_size(st.st_size)}); file_read shows text only.",
                              outcome="error")
        f.seek(0)
        lines: list[str] = []
        used = 0
        number = 0
        more = False
        while True:
            raw = f.readline(MAX_READ_BYTES + 1)
            if not raw:
                break
            number += 1
            if number < offset:
                continue
            if len(lines) >= limit or used + len(raw) > MAX_READ_BYTES:
                if not lines:  # one line longer than a whole read: show its start
                    lines.append(raw[:MAX_READ_BYTES].decode("utf-8", "replace") + "…\n")
                more = True
                break
            lines.append(raw.decode("utf-8", "replace"))
            used += len(raw)
    if not lines:
        if offset > 1:
            return ToolResult(f"{target.shown} has only {number} lines; nothing at offset {offset}.",
                              outcome="error")
        return ToolResult(f"[{target.shown}: empty file]")
    last = offset + len(lines) - 1
    head = f"[{target.shown}: lines {offset}-{last}, {_size(st.st_size)} in all]\n"
    tail = f"\n[more follows: continue with offset={last + 1}]" if more else ""
    return ToolResult(head + "".join(lines) + tail)


async def file_read(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    target = confine.resolve(ctx, args["path"])
    offset = max(1, int(args.get("offset", 1)))
    limit = min(max(1, int(args.get("limit", DEFAULT_READ_LINES))), 100_000)
    return await _in_thread(target, _read, offset, limit)


# ---------------------------------------------------------------- file_write


async def file_write(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    data = args["content"].encode("utf-8")
    if len(data) > MAX_WRITE_BYTES:
        return ToolResult(f"content is {_size(len(data))}; file_write takes at most {_size(MAX_WRITE_BYTES)}"
                          " per call (append in parts).", outcome="error")
    target = confine.resolve(ctx, args["path"], write=True)
    if args.get("append"):
        size = await _in_thread(target, confine.append, data)
        return ToolResult(f"appended {_size(len(data))} to {target.shown} (now {_size(size)})")
    await _in_thread(target, confine.write_atomic, data)
    return ToolResult(f"wrote {_size(len(data))} to {target.shown}")


# ---------------------------------------------------------------- file_list


def _entry(name: str, st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return name + "/"
    if stat.S_ISLNK(st.st_mode):
        return name + "  (symbolic link)"
    if stat.S_ISREG(st.st_mode):
        return f"{name}  {_size(st.st_size)}"
    return name + "  (special file)"


def _list(target: confine.Target, recursive: bool) -> ToolResult:
    fd = confine.open_dir(target)
    lines: list[str] = []
    truncated = False
    try:
        for dirpath, dirnames, filenames, dirfd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            rel = "/".join(p for p in dirpath.split("/") if p not in ("", "."))
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except OSError:
                    continue
                lines.append(_entry(f"{rel}/{name}" if rel else name, st))
                if len(lines) >= MAX_LIST_ENTRIES:
                    truncated = True
                    break
            if truncated or not recursive:
                break
    finally:
        os.close(fd)
    where = target.shown if target.shown.endswith("/") else target.shown + "/"
    if not lines:
        return ToolResult(f"[{where}: empty]")
    note = f"\n[stopped at {MAX_LIST_ENTRIES} entries: list a subfolder]" if truncated else ""
    return ToolResult(f"[{where}]\n" + "\n".join(lines) + note)


async def file_list(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    target = confine.resolve(ctx, args.get("path", ""))
    return await _in_thread(target, _list, bool(args.get("recursive", False)))


# ---------------------------------------------------------------- file_search


def _excluded(ctx: ToolContext, target: confine.Target) -> list[list[str]]:
    """Forbidden folders that lie inside the searched root (a configuration that nests them): skipped."""
    return [list(area.relative_to(target.root).parts)
            for area, _name in confine.forbidden_areas(ctx) if target.root in area.parents]


async def file_search(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    pattern = args["pattern"]
    if not pattern:
        return ToolResult("the pattern is empty", outcome="error")
    target = confine.resolve(ctx, args.get("path", ""))
    request = {
        "root": str(target.root), "parts": list(target.parts), "pattern": pattern,
        "shown": target.shown.rstrip("/"),
        "regex": bool(args.get("regex", False)), "ignore_case": bool(args.get("ignore_case", False)),
        "max_results": MAX_SEARCH_RESULTS, "exclude": _excluded(ctx, target),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", search.__file__, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        env={"PATH": os.defpath, "LANG": "C.UTF-8"})
    try:
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(request).encode()), SEARCH_TIMEOUT_S)
    except asyncio.TimeoutError:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await proc.wait()
        return ToolResult(f"the search took longer than {SEARCH_TIMEOUT_S:g}s and was stopped; narrow the"
                          " path or simplify the pattern.", outcome="error")
    except BaseException:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        raise
    if proc.returncode != 0:
        return ToolResult(f"the search failed: {err.decode('utf-8', 'replace')[-500:]}", outcome="error")
    answer = json.loads(out)
    if "error" in answer:
        return ToolResult(f"search: {answer['error']}", outcome="error")
    matches = answer["matches"]
    if not matches:
        return ToolResult(f"no match for {pattern!r} in {target.shown} ({answer['scanned']} files searched)")
    note = (f"\n[stopped at {len(matches)} matches or {search.MAX_FILES} files: narrow the search]"
            if answer["truncated"] else "")
    return ToolResult("\n".join(matches) + note)


# ---------------------------------------------------------------- specs

_PATH = {"type": "string", "description": confine.PATH_HELP}

TOOLS = [
    Tool(ToolSpec("file_read", "Read a text file, up to 64 KB or `limit` lines per call, from line `offset`"
                  " (1-based). " + confine.PATH_HELP,
                  {"type": "object", "properties": {
                      "path": _PATH,
                      "offset": {"type": "integer", "minimum": 1, "description": "first line to show (default 1)"},
                      "limit": {"type": "integer", "minimum": 1, "description": "most lines to show (default 2000)"},
                  }, "required": ["path"], "additionalProperties": False}),
         "files", file_read, inline_limit=MAX_READ_BYTES + 4096),
    Tool(ToolSpec("file_write", "Write a text file (replacing it), or append to it; missing folders are"
                  " created. At most 1 MB per call. " + confine.PATH_HELP,
                  {"type": "object", "properties": {
                      "path": _PATH,
                      "content": {"type": "string"},
                      "append": {"type": "boolean", "description": "add to the end instead of replacing"},
                  }, "required": ["path", "content"], "additionalProperties": False}),
         "files", file_write),
    Tool(ToolSpec("file_list", "List a folder (default: the shared workspace's top), with sizes; folders end"
                  " with '/'. At most 500 entries. " + confine.PATH_HELP,
                  {"type": "object", "properties": {
                      "path": _PATH,
                      "recursive": {"type": "boolean", "description": "include subfolders' contents"},
                  }, "additionalProperties": False}),
         "files", file_list),
    Tool(ToolSpec("file_search", "Search file contents under a folder (default: the shared workspace) or in"
                  " one file, for a substring (default) or a Python regular expression; answers"
                  " 'path:line: text', at most 100 matches. Binary and hard-linked files, files over 4 MB"
                  " and symbolic links are skipped. " + confine.PATH_HELP,
                  {"type": "object", "properties": {
                      "pattern": {"type": "string"},
                      "path": _PATH,
                      "regex": {"type": "boolean", "description": "treat pattern as a regular expression"},
                      "ignore_case": {"type": "boolean"},
                  }, "required": ["pattern"], "additionalProperties": False}),
         "files", file_search),
]
