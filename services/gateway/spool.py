"""A gateway process's spool: platform events acknowledged before the writer stored them, for a platform
whose retries end sooner than a writer outage may last (DESIGN "The rule of durability", rule 1).

Slack redelivers an unacked Socket Mode envelope 3 times over about 5 minutes and retries an Events API
post 3 times; a writer away longer (an upgrade, a crash loop, a full disk) would lose what came
meanwhile. (Telegram keeps updates for 24 h and WhatsApp Cloud retries a webhook for days: their
gateways hold the platform's ack instead and need no spool.)

``take(instance, key, event, handle)`` starts ``handle()`` (the hand-off to the writer, which holds while
the writer's condition lasts) and returns once the event is durable on this host: stored by the writer,
or, when that did not happen within DIRECT_S (at once while earlier events wait in the spool), appended
to ``data/spool/<process>.spool`` and fsynced. Only then may the caller acknowledge it. ``handle()`` goes
on in the background until it is stored; then a done mark is appended (not fsynced: an event replayed
again is deduped by the writer's idempotency keys). A redelivery of an event held here (same ``key``)
waits for the first copy instead of being spooled twice.

At start, ``pending()`` gives what a predecessor spooled and the writer had not stored, in the order it
came, and ``replay`` hands each to its channel before the channel receives anything new; one chat's
events keep their order because each is handled under the chat's lock in arrival order.

The file is JSON lines, ``{"seq", "instance", "key", "event", "at"}`` for an event and ``{"done": seq}``
for a stored one; a torn last line (a crash mid-append, never acknowledged) is ignored. It is bounded
(MAX_BYTES; past it an event is not acknowledged, and the platform redelivers it), emptied once
everything in it is stored, rewritten without the stored events when it would pass the bound, and keeps
RESERVE_BYTES of blocks allocated ahead (fallocate KEEP_SIZE), so appends go on while the disk is full.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os

from pathlib import Path
from typing import Awaitable, Callable

from common.held_files import SpoolEntry, read_spool
from common.home import fsync_dir, make_private_dir

DIRECT_S = 1.0                 # the writer gets this long to store an event before it is spooled
MAX_BYTES = 64 * 1024 * 1024   # the spool's bound on disk
RESERVE_BYTES = 4 * 1024 * 1024  # allocated ahead of the end of the file
_FALLOC_FL_KEEP_SIZE = 1

Handle = Callable[[], Awaitable[object]]


@functools.cache
def _fallocate():
    """libc's fallocate, looked up when a spool first allocates: every gateway imports this module, but only a
    platform that spools (Slack) needs it, and ctypes cost every gateway ~0.25 MB of RSS at start. The
    process's own symbols hold the C library's (dlopen(NULL)): no ldconfig child, glibc or musl alike."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if not hasattr(libc, "fallocate"):
        return None
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    return libc.fallocate


def allocate_ahead(fd: int, offset: int, length: int) -> bool:
    """Blocks for ``length`` bytes from ``offset`` without changing the file's size (best effort)."""
    fallocate = _fallocate()
    if fallocate is None:
        return False
    return fallocate(fd, _FALLOC_FL_KEEP_SIZE, offset, length) == 0


class Spool:
    def __init__(self, path: Path, log, *, direct_s: float = DIRECT_S, max_bytes: int = MAX_BYTES) -> None:
        self.path = path
        self.log = log
        self.direct_s = direct_s
        self.max_bytes = max_bytes
        self.fd: int | None = None
        self.size = 0
        self.seq = 0
        self.spooled: dict[int, SpoolEntry] = {}  # in the file, not yet stored
        self.held: dict[str, SpoolEntry] = {}     # by key: taken here and not yet stored
        self.tasks: set[asyncio.Task] = set()
        self.ready: dict[str, asyncio.Event] = {}  # per instance: its replay is under way
        self.on_failure: Callable[[SpoolEntry, BaseException], Awaitable[None]] | None = None  # the dead letters
        self._lock = asyncio.Lock()
        self._loaded: list[SpoolEntry] = []

    # ------------------------------------------------------------ start

    def open(self) -> None:
        """Read what a predecessor left, and keep the file open for appends. A file that cannot be made
        (the disk full at start) is tried again at the first append; meanwhile nothing is spooled, so
        events are acknowledged only once stored."""
        self._loaded, self.seq = read_spool(self.path)
        for entry in self._loaded:
            self.spooled[entry.seq] = entry
        try:
            self._open_file()
        except OSError as exc:
            self.log.error("spool_unavailable", path=str(self.path), error=exc.strerror,
                           note="events are acknowledged only once stored until it can be made")
            return
        if self._loaded:
            self.log.warning("spool_replay", path=str(self.path), events=len(self._loaded),
                             note="acknowledged to the platform before the writer stored them: handed to it now")
        elif self.size:
            self._empty()
        allocate_ahead(self.fd, self.size, RESERVE_BYTES)

    def _open_file(self) -> None:
        make_private_dir(self.path.parent)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.size = os.fstat(self.fd).st_size

    def replay(self, instance: str, handle_for: Callable[[dict], Handle]) -> int:
        """Hand the instance's spooled events to it, in order (before it receives anything new)."""
        count = 0
        for entry in [e for e in self._loaded if e.instance == instance]:
            entry.durable = asyncio.get_running_loop().create_future()
            entry.durable.set_result(True)
            if entry.key:
                self.held[entry.key] = entry
            self._start(entry, handle_for(entry.event))
            count += 1
        self._loaded = [e for e in self._loaded if e.instance != instance]
        self.ready.setdefault(instance, asyncio.Event()).set()
        return count

    def pending_instances(self) -> set[str]:
        return {e.instance for e in self._loaded}

    # ------------------------------------------------------------ taking an event

    async def take(self, instance: str, key: str, event: dict, handle: Handle) -> bool:
        """True once the event is durable here (stored, or spooled and fsynced); False when the spool has no
        room and the writer did not store it in time: then the caller must not acknowledge it."""
        ready = self.ready.setdefault(instance, asyncio.Event())
        if not ready.is_set():
            await ready.wait()
        first = self.held.get(key) if key else None
        if first is not None:  # a redelivery of an event held here: durable when the first copy is
            return await asyncio.shield(first.durable)
        self.seq += 1
        entry = SpoolEntry(self.seq, instance, key, event)
        entry.durable = asyncio.get_running_loop().create_future()
        if key:
            self.held[key] = entry
        task = self._start(entry, handle)
        wait_s = 0.0 if self.spooled else self.direct_s  # others already wait in the spool: join them now
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if task in done:
            return await asyncio.shield(entry.durable)
        if await self._append(entry):
            if not entry.durable.done():
                entry.durable.set_result(True)
            return True
        return entry.durable.done() and entry.durable.result()

    def _start(self, entry: SpoolEntry, handle: Handle) -> asyncio.Task:
        task = asyncio.create_task(self._handle(entry, handle))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def _handle(self, entry: SpoolEntry, handle: Handle) -> None:
        stored = True
        try:
            await handle()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # not the writer's condition (that is held inside): a bug on this event
            self.log.error("spooled_event_failed", seq=entry.seq, key=entry.key, error=repr(exc))
            try:
                if self.on_failure is None:
                    raise
                await self.on_failure(entry, exc)  # kept whole as a dead letter
            except Exception as err:  # noqa: BLE001 - not acknowledged, or replayed at the next start
                self.log.error("spooled_event_not_kept", seq=entry.seq, error=repr(err))
                stored = False
        self._release(entry)
        if not entry.durable.done():
            entry.durable.set_result(stored)
        if stored:
            await self._mark_done(entry)

    def _release(self, entry: SpoolEntry) -> None:
        if entry.key and self.held.get(entry.key) is entry:
            del self.held[entry.key]

    # ------------------------------------------------------------ the file

    async def _append(self, entry: SpoolEntry) -> bool:
        line = (json.dumps({"seq": entry.seq, "instance": entry.instance, "key": entry.key, "event": entry.event,
                            "at": entry.at}, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        async with self._lock:
            if entry.durable.done():  # stored while it waited for the lock
                return True
            if self.fd is None:
                try:
                    self._open_file()
                except OSError as exc:
                    self.log.error("spool_write_failed", path=str(self.path), error=exc.strerror)
                    return False
            if self.size + len(line) > self.max_bytes:
                await asyncio.to_thread(self._compact)
            if self.size + len(line) > self.max_bytes:
                self.log.error("spool_full", path=str(self.path), bytes=self.size, events=len(self.spooled),
                               note="not acknowledged: the platform redelivers it, if it still does")
                return False
            try:
                await asyncio.to_thread(self._write, line)
            except OSError as exc:
                self.log.error("spool_write_failed", path=str(self.path), error=exc.strerror)
                return False
            entry.spooled = True
            self.spooled[entry.seq] = entry
            if len(self.spooled) == 1:
                self.log.warning("spooling", path=str(self.path), note="the writer has not stored new events in"
                                 f" {self.direct_s:g}s: they are acknowledged once fsynced here, and handed to it in order")
            return True

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        os.fsync(self.fd)
        self.size += len(data)

    async def _mark_done(self, entry: SpoolEntry) -> None:
        async with self._lock:  # after an _append under way: it sets ``spooled`` under this lock
            if not entry.spooled:
                return
            self.spooled.pop(entry.seq, None)
            if self.fd is None:  # the file could not be opened: replayed again at the next start, and deduped
                return
            if not self.spooled:
                await asyncio.to_thread(self._empty)
                self.log.info("spool_drained", path=str(self.path))
                return
            try:
                await asyncio.to_thread(self._write_done, entry.seq)
            except OSError as exc:  # replayed again at the next start, and deduped
                self.log.warning("spool_mark_failed", error=exc.strerror)

    def _write_done(self, seq: int) -> None:
        data = f'{{"done":{seq}}}\n'.encode()
        os.write(self.fd, data)
        self.size += len(data)

    def _empty(self) -> None:
        """Everything in the file is stored: start it again (space allocated ahead again)."""
        os.ftruncate(self.fd, 0)
        os.fsync(self.fd)
        self.size = 0
        allocate_ahead(self.fd, 0, RESERVE_BYTES)

    def _compact(self) -> None:
        """Rewrite the file with only the events not yet stored (atomically), to make room."""
        lines = [json.dumps({"seq": e.seq, "instance": e.instance, "key": e.key, "event": e.event, "at": e.at},
                            ensure_ascii=False, separators=(",", ":")) + "\n"
                 for e in sorted(self.spooled.values(), key=lambda e: e.seq)]
        data = "".join(lines).encode()
        if len(data) >= self.size:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND, 0o600)
        self.size = len(data)
        allocate_ahead(self.fd, self.size, RESERVE_BYTES)

    def stats(self) -> tuple[int, int]:
        """(events spooled and not yet stored, bytes on disk)."""
        return len(self.spooled), self.size

    async def close(self) -> None:
        """At stop: handlers under way are cut (what is spooled is replayed at the next start)."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
