"""Inbound files: saved under data/attachments/<agent>/<date>/, private, never larger than the cap."""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

from common.errors import StarlingError
from common.holding import NO_SPACE

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
Download = Callable[..., Awaitable[AsyncIterator[bytes]]]  # Channel.download: a FileRef -> its bytes


class TooLarge(StarlingError):
    def __init__(self, size: int, cap: int) -> None:
        super().__init__(f"the file is {_mb(size)}, over the {_mb(cap)} limit")
        self.size = size
        self.cap = cap


def _mb(n: int) -> str:
    return f"{n / 1_048_576:.1f} MB"


def safe_name(name: str, fallback: str = "file") -> str:
    """A file name that cannot climb out of its folder or hide: no separators, no leading dot."""
    cleaned = _UNSAFE.sub("_", os.path.basename(name or "")).strip("._")[:100]
    return cleaned or fallback


def target(attachments_dir: Path, agent: str, when: float, name: str) -> Path:
    day = time.strftime("%Y-%m-%d", time.gmtime(when))
    folder = attachments_dir / safe_name(agent, "agent") / day
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder / name[:200]  # the caller's name is made of safe_name() parts


async def save(chunks: AsyncIterator[bytes], path: Path, cap: int) -> int:
    """Write ``chunks`` to ``path`` (0600) and return the size; past ``cap`` bytes the partial file is
    removed and TooLarge raised. Each download has a temp file of its own, so two at once never mix;
    a name already taken (a redelivery of the same message) is replaced by the same bytes."""
    fd, tmp_name = tempfile.mkstemp(prefix=".part-", dir=path.parent)
    tmp = Path(tmp_name)
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in chunks:
                size += len(chunk)
                if size > cap:
                    raise TooLarge(size, cap)
                out.write(chunk)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return size


def describe(kind: str, path: Path | None, size: int, note: str = "") -> str:
    """The line the agent reads in place of the file: what it is and where it was saved (or why not)."""
    if path is None:
        return f"[{kind} not saved: {note}]"
    return f"[{kind} attached: {path} ({size / 1024:.0f} KB)]"


@dataclass(frozen=True)
class Into:
    """Where one message's files go and how large each may be: <attachments_dir>/<agent>/<date of when>/,
    each named by the instance, the chat, the message and its place in it."""

    attachments_dir: Path
    agent: str
    instance: str
    cap: int      # bytes
    when: float   # the message's time (its folder's date)


async def attach_all(msg, files: list, download: Download, into: Into, log, budget_s: float) -> None:
    """Fetch a message's files (one budget for all of them, not one each) and tell the agent about each."""
    deadline = time.monotonic() + budget_s
    for seq, ref in enumerate(files):
        await attach(msg, seq, ref, download, into, log, timeout_s=max(0.05, deadline - time.monotonic()))


async def attach(msg, seq: int, ref, download: Download, into: Into, log, timeout_s: float = 120.0) -> None:
    """Fetch one file of an inbound message (``ref``: a FileRef; ``download(ref)`` gives its bytes) into
    the attachments folder and tell the agent about it. Over the cap (as announced, or as it arrives),
    failing, or slower than ``timeout_s``, the agent is told why instead. The file is named by the
    instance, chat, message and its place in the message (``seq``), each cleaned on its own, so neither
    another chat nor a crafted name can land on the same path."""
    note = ""
    if ref.size > into.cap:
        note = f"{_mb(ref.size)} is over the {_mb(into.cap)} limit"
    else:
        parts = (into.instance, msg.chat, msg.platform_msg_id, str(seq))
        unique = "-".join(safe_name(p, "x") for p in parts) + "-" + safe_name(ref.name)[:60]
        try:
            path = target(into.attachments_dir, into.agent, into.when, unique)
            saved = await asyncio.wait_for(_fetch_into(download, ref, path, into.cap), timeout_s)
        except TooLarge as exc:
            note = str(exc)
        except asyncio.TimeoutError:
            note = f"the download took longer than {timeout_s:.0f}s"
        except OSError as exc:
            if exc.errno in NO_SPACE:  # the disk's condition, not the file's: the message waits (common/holding.py)
                raise
            note = f"could not be fetched ({exc})"
        except (StarlingError, KeyError, TypeError, ValueError) as exc:
            note = f"could not be fetched ({exc})"
        else:
            msg.attachments.append(str(path))
            msg.text = f"{msg.text}\n{describe(ref.kind, path, saved)}".strip()
            return
    log.warning("attachment_skipped", kind=ref.kind, reason=note)
    msg.text = f"{msg.text}\n{describe(ref.kind, None, ref.size, note)}".strip()


async def _fetch_into(download: Download, ref, path: Path, cap: int) -> int:
    return await save(await download(ref), path, cap)
