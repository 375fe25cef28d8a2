"""send_message and send_file: queue a message or a file for the current chat (the outbox, via the writer).

A file is confined exactly like the file tools (confine.py), then copied (0600) to
data/attachments/<agent>/<YYYY-MM-DD>/sent-<token>-<name>, and that copy is queued: the gateway sends
what the agent chose, even if the workspace file changes or is swapped for a link before delivery.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from common.home import DIR_MODE, FILE_MODE
from schema import messages as m
from services.runner.llm import ToolSpec
from services.runner.tools import confine
from services.runner.tools.base import Tool, ToolContext, ToolError, ToolResult

MAX_TEXT = 32 * 1024
MAX_FILE_BYTES = 50 * 1024 * 1024  # the smallest platform limit (Telegram bots)


async def _enqueue(ctx: ToolContext, reply: m.Reply) -> list[int]:
    result = await ctx.call(m.EnqueueOutbox(instance=ctx.instance, chat=ctx.chat, replies=[reply],
                                            session_id=ctx.session_id, turn_id=ctx.turn_id if ctx.worker else 0,
                                            worker=ctx.worker))
    return list(result.ids) if isinstance(result, m.Queued) else []


async def send_message(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    text = args["text"]
    if not text.strip():
        return ToolResult("the message is empty", outcome="error")
    if len(text.encode("utf-8")) > MAX_TEXT:
        return ToolResult(f"the message is over {MAX_TEXT // 1024} KB; send a file instead", outcome="error")
    await _enqueue(ctx, m.Reply(text=text))
    return ToolResult("message queued for this chat")


def _copy_out(ctx: ToolContext, target: confine.Target) -> Path:
    fd, st = confine.open_read(target)
    try:
        if st.st_size > MAX_FILE_BYTES:
            raise ToolError(f"{target.shown} is {st.st_size} bytes; files over {MAX_FILE_BYTES // 2**20} MB"
                            " cannot be sent")
        folder = ctx.paths.attachments_dir / ctx.agent / time.strftime("%Y-%m-%d", time.gmtime())
        folder.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9._-]+", "_", target.parts[-1])[-100:] or "file"
        dest = folder / f"sent-{secrets.token_hex(4)}-{name}"
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
        try:
            copied = 0
            while chunk := os.read(fd, 1 << 20):
                copied += len(chunk)
                if copied > MAX_FILE_BYTES:
                    raise ToolError(f"{target.shown} grew past {MAX_FILE_BYTES // 2**20} MB while being copied")
                os.write(out, chunk)
            os.fsync(out)
        except BaseException:
            os.close(out)
            dest.unlink(missing_ok=True)
            raise
        os.close(out)
        return dest
    finally:
        os.close(fd)


async def send_file(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    target = confine.resolve(ctx, args["path"])
    try:
        copy = await asyncio.to_thread(_copy_out, ctx, target)
    except FileNotFoundError:
        raise ToolError(f"{target.shown}: no such file") from None
    except OSError as e:
        raise ToolError(f"{target.shown}: {e.strerror or e}") from None
    await _enqueue(ctx, m.Reply(text=args.get("caption", ""), file_path=str(copy)))
    return ToolResult(f"{target.shown} queued for this chat", files=[copy])


TOOLS = [
    Tool(ToolSpec("send_message",
                  "Send a message to this chat now, before your final answer (progress, a reminder). Your final"
                  " answer is sent anyway: do not repeat it here.",
                  {"type": "object", "properties": {"text": {"type": "string"}},
                   "required": ["text"], "additionalProperties": False}),
         "send", send_message),
    Tool(ToolSpec("send_file",
                  "Send a file from the workspace to this chat, with an optional caption (at most 50 MB). "
                  + confine.PATH_HELP,
                  {"type": "object", "properties": {
                      "path": {"type": "string"},
                      "caption": {"type": "string"},
                  }, "required": ["path"], "additionalProperties": False}),
         "send", send_file),
]
