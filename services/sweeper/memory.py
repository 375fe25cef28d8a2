"""Session memory: conversations closed by a daily or idle reset, and closed conversations written to
``[session_memory] active_dir`` as ``YYYY-MM-DD-HHMM.md``, dated by when they were last alive.

Resets. With ``[session_memory.reset] mode = "daily"`` the sweeper closes, through the writer
(``ResetSession``), every open conversation quiet since before the last ``boundary_hour`` (local time);
with ``"idle"``, every one quiet for ``idle_minutes``. It looks every heartbeat interval; the writer
closes only a conversation that was not active since the sweeper looked and has no turn pending,
running or parked. The chat's next message then opens a fresh conversation.

Captures. A closed conversation with no turn still in use is written once (``MarkCaptured`` through
the writer afterwards; a rewrite after a crash between the two replaces the same file). The date is
that of its last message that was not a chat command, so a chat alive until 23:00 and ended by a
``/new`` (or a reset) the next morning is filed under the evening before. A conversation with nothing
to write, or already older than ``retention_days``, is marked without a file. Captures older than
``retention_days`` (by the time in their name) are removed; other files in the folder are not touched.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from common import chat_commands
from common.db import read_tx
from common.errors import WriteRejected
from common.home import write_private_file
from common.stores import retention_store
from schema import messages as m

DAY_S = 86400.0
RESET_BATCH = 200
CAPTURE_BATCH = 50
PAGE = 500
NAME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})-(\d{2})(\d{2})(?:-\d+)?\.md$")
MARKER = "<!-- starling session {id} -->"
REASONS = {"new": chat_commands.NEW, "daily": "the daily reset", "idle": "the idle reset"}


def last_boundary(now: float, hour: int) -> float:
    """The latest local time at ``hour``:00 not after ``now`` (daylight saving handled by mktime)."""
    lt = time.localtime(now)
    at = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday, hour, 0, 0, 0, 0, -1))
    if at > now:
        at = time.mktime((lt.tm_year, lt.tm_mon, lt.tm_mday - 1, hour, 0, 0, 0, 0, -1))
    return at


def file_stem(when: float) -> str:
    return time.strftime("%Y-%m-%d-%H%M", time.localtime(when))


def stem_time(name: str) -> float | None:
    """The local time a capture's name stands for; None for a file that is not a capture."""
    match = NAME.match(name)
    if match is None:
        return None
    year, month, day, hour, minute = (int(g) for g in match.groups())
    try:
        return time.mktime((year, month, day, hour, minute, 0, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


class Memory:
    def __init__(self, svc, call, reader, log) -> None:
        self.svc = svc
        self.folder: Path = svc.paths.memories_dir
        self.enabled = svc.paths.memories_enabled
        self.call = call
        self.reader = reader  # a function returning the read-only connection
        self.log = log

    @property
    def cfg(self):
        """[session_memory], read at each use: `starling reload` changes retention_days in place (SIGHUP)."""
        return self.svc.cfg.session_memory

    # ------------------------------------------------------------ resets

    def reset_since(self, now: float) -> float | None:
        """Open conversations quiet since before this time are due for a reset (None: resets are off)."""
        reset = self.cfg.reset
        if reset.mode == "daily":
            return last_boundary(now, reset.boundary_hour)
        if reset.mode == "idle":
            return now - reset.idle_minutes * 60
        return None

    async def reset(self, now: float) -> int:
        since = self.reset_since(now)
        if since is None:
            return 0
        closed = 0
        while True:
            with read_tx(self.reader()) as conn:
                quiet = retention_store.open_quiet(conn, since, RESET_BATCH)
            refused = 0
            for session_id, last_active_at in quiet:
                try:
                    await self.call(m.ResetSession(session_id=session_id, reason=self.cfg.reset.mode,
                                                   last_active_at=last_active_at))
                    closed += 1
                except WriteRejected as exc:
                    if exc.code not in ("conflict", "not_found"):
                        raise
                    refused += 1  # a message came in meanwhile: it stays open
            if len(quiet) < RESET_BATCH or refused == len(quiet):
                break
        if closed:
            self.log.info("sessions_reset", reason=self.cfg.reset.mode, count=closed,
                          quiet_since=time.strftime("%Y-%m-%d %H:%M", time.localtime(since)))
        return closed

    # ------------------------------------------------------------ captures

    async def capture(self, now: float) -> int:
        if not self.enabled:
            return 0
        written = 0
        while True:
            with read_tx(self.reader()) as conn:
                batch = retention_store.to_capture(conn, CAPTURE_BATCH)
            if not batch:
                break
            for session in batch:
                path = self._write(session, now)
                if path is not None:
                    written += 1
                    self.log.info("session_captured", session_id=session.id, path=str(path))
            await self.call(m.MarkCaptured(session_ids=[s.id for s in batch]))
            if len(batch) < CAPTURE_BATCH:
                break
        return written

    def _lines(self, session_id: int) -> list[retention_store.Line]:
        """The conversation as a person would reread it: messages and answers, without chat commands."""
        lines: list[retention_store.Line] = []
        skipped: set[int] = set()
        after = (0, 0)
        while True:
            with read_tx(self.reader()) as conn:  # a page per short read transaction
                page = retention_store.transcript(conn, session_id, after, PAGE)
            for line in page:
                if line.role == "user" and chat_commands.is_command(line.content):
                    skipped.add(line.thread)
                elif line.thread not in skipped and line.role in ("user", "assistant") and line.content.strip():
                    lines.append(line)
            if len(page) < PAGE:
                return lines
            after = (page[-1].thread, page[-1].id)

    def _write(self, session: retention_store.Closed, now: float) -> Path | None:
        cutoff = now - self.cfg.retention_days * DAY_S
        if session.last_active_at < cutoff:
            return None  # already past retention (the capture would be removed at once): not even read
        lines = self._lines(session.id)
        if not lines:
            return None
        last = max(line.created_at for line in lines)
        if last < cutoff:
            return None
        text = render(session, lines)
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self._place(file_stem(last), session.id)
        write_private_file(path, text.encode())
        return path

    def _place(self, stem: str, session_id: int) -> Path:
        """``stem.md``, or ``stem-2.md``, ... when another conversation ended in the same minute; the file
        this conversation already has (written before a crash) is reused."""
        marker = MARKER.format(id=session_id)
        n = 1
        while True:
            path = self.folder / (f"{stem}.md" if n == 1 else f"{stem}-{n}.md")
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    first = f.readline().strip()
            except FileNotFoundError:
                return path
            if first == marker:
                return path
            n += 1

    # ------------------------------------------------------------ retention of captures

    def expire(self, now: float, stop=None) -> tuple[int, int]:
        """Remove captures older than retention_days: (files, bytes)."""
        if not self.enabled:
            return 0, 0
        cutoff = now - self.cfg.retention_days * DAY_S
        files = size = 0
        try:
            entries = list(os.scandir(self.folder))
        except OSError:
            return 0, 0
        for entry in entries:
            if stop is not None and stop.is_set():
                break
            when = stem_time(entry.name)
            if when is None or when >= cutoff or not entry.is_file(follow_symlinks=False):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                os.unlink(entry.path)
            except OSError:
                continue
            files += 1
            size += st.st_size
        return files, size


def render(session: retention_store.Closed, lines: list[retention_store.Line]) -> str:
    first, last = lines[0].created_at, max(line.created_at for line in lines)
    span = f"{_when(first)} – {_when(last, first)}"
    ended = REASONS.get(session.close_reason, session.close_reason or "closed")
    out = [
        MARKER.format(id=session.id),
        f"# Conversation with {session.agent}, {span}",
        "",
        f"Agent `{session.agent}` · chat `{session.instance}:{session.chat}` · ended by {ended}",
        "",
    ]
    previous = first
    for line in lines:
        who = (line.sender_name or line.sender or "user") if line.role == "user" else session.agent
        out.append(f"**{who}** · {_when(line.created_at, previous)}")
        out.append("")
        out.append(line.content.strip())
        out.append("")
        previous = line.created_at
    return "\n".join(out)


def _when(at: float, since: float | None = None) -> str:
    """``HH:MM``, with the date in front when it is another day than ``since`` (or there is no ``since``)."""
    lt = time.localtime(at)
    if since is not None and time.localtime(since)[:3] == lt[:3]:
        return time.strftime("%H:%M", lt)
    return time.strftime("%Y-%m-%d %H:%M", lt)
