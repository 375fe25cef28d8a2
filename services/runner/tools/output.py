"""The size bound on tool results: a result too large for the context goes to data/tool-output/<session>/.

The model then gets the file's name (readable with file_read as ``tool-output/<name>``), the total size,
the first ~2 KB and the last ~1 KB. Files are 0600 in 0700 folders; the sweeper removes them after
``retention.tool_output_days``.
"""

from __future__ import annotations

import os
from pathlib import Path

from common.home import DIR_MODE, FILE_MODE
from services.runner.tools.base import ToolContext

INLINE_LIMIT = 16 * 1024
HEAD_BYTES = 2048
TAIL_BYTES = 1024
MAX_NAMES = 10_000


def _folder(ctx: ToolContext) -> Path:
    folder = ctx.paths.tool_output_dir / str(ctx.session_id)
    for f in (ctx.paths.tool_output_dir, folder):
        f.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        if f.stat().st_mode & 0o777 != DIR_MODE:
            os.chmod(f, DIR_MODE)
    return folder


def save(ctx: ToolContext, tool: str, data: bytes) -> Path:
    """Write data to <session>/<turn>-<n>-<tool>.txt with the first free n (O_EXCL: no overwrite, no race)."""
    folder = _folder(ctx)
    for n in range(1, MAX_NAMES):
        path = folder / f"{ctx.turn_id}-{n}-{tool}.txt"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path
    raise RuntimeError(f"{folder}: no free file name for {tool} output")


def bound(ctx: ToolContext, tool: str, content: str, limit: int = INLINE_LIMIT) -> tuple[str, str]:
    """(what the model sees, the file's path or "") for one tool result."""
    data = content.encode("utf-8", "replace")
    if len(data) <= limit:
        return content, ""
    path = save(ctx, tool, data)
    head = data[:HEAD_BYTES].decode("utf-8", "ignore")
    tail = data[-TAIL_BYTES:].decode("utf-8", "ignore")
    shown = f"tool-output/{path.name}"
    text = (f"[{tool} result: {len(data)} bytes, too large to show in full. It is saved as {shown};"
            f" read parts of it with file_read path={shown!r} offset/limit (lines). The first"
            f" {HEAD_BYTES} bytes:]\n{head}\n[... the last {TAIL_BYTES} bytes:]\n{tail}")
    return text, str(path)
