"""Logs: each service's JSON log (data/logs/<service>.log) tailed live over Server-Sent Events, filtered by
level and by an id followed across services (a turn, session, outbox row or platform message id matches
any line that carries it), and the warnings and errors every service stored in the daemon_log table."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from aiohttp import web

from common.stores import dashboard_store
from services.control.dashboard.app import Dashboard

LEVELS = {"debug": 10, "info": 20, "warning": 30, "warn": 30, "error": 40, "exception": 40, "critical": 50}
TAIL_BYTES = 256 * 1024  # read from the end of each file for the first screen
SHOWN = 300
POLL_S = 0.3
STREAM_MAX_S = 600.0  # a stream ends after this; EventSource reconnects by itself
KEEPALIVE_S = 15.0
MAX_STREAMS = 16
_HEAD = ("ts", "level", "service", "event", "pid")


def log_names(logs_dir: Path) -> list[str]:
    return sorted(p.stem for p in logs_dir.glob("*.log") if p.is_file())


def parse(raw: str, stem: str) -> dict | None:
    try:
        event = json.loads(raw)
    except ValueError:
        return {"ts": "", "level": "", "service": stem, "event": raw[:2000], "rest": "", "raw": {}}
    if not isinstance(event, dict):
        return None
    rest = " ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in event.items() if k not in _HEAD)
    return {"ts": str(event.get("ts", "")), "level": str(event.get("level", "")),
            "service": str(event.get("service") or stem), "event": str(event.get("event", "")),
            "rest": rest[:4000], "raw": event}


def keeps(line: dict, level: int, follow: str) -> bool:
    if LEVELS.get(line["level"].lower(), 0 if line["level"] else 20) < level:
        return False
    if not follow:
        return True
    return any(str(v) == follow for v in line["raw"].values() if isinstance(v, (str, int)) and not isinstance(v, bool))


def _filters(request: web.Request) -> tuple[str, int, str]:
    q = request.query
    service = q.get("service", "")[:100]
    level = LEVELS.get(q.get("level", "info").lower(), 20)
    return service, level, q.get("id", "").strip()[:200]


def _files(d: Dashboard, service: str) -> list[Path]:
    logs = d.deps.paths.logs_dir
    names = log_names(logs)
    if service:
        names = [n for n in names if n == service or n.startswith(service + "-")]
    return [logs / f"{n}.log" for n in names]


def tail(files: list[Path], level: int, follow: str, limit: int = SHOWN) -> list[dict]:
    lines = []
    for path in files:
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
                chunk = f.read(TAIL_BYTES).decode("utf-8", "replace").splitlines()
        except OSError:
            continue
        for raw in chunk[1:] if len(chunk) > 1 else chunk:  # the first may be cut in the middle
            line = parse(raw, path.stem)
            if line is not None and keeps(line, level, follow):
                lines.append(line)
    lines.sort(key=lambda line: line["ts"])
    return lines[-limit:]


async def logs(d: Dashboard, request: web.Request) -> web.StreamResponse:
    service, level, follow = _filters(request)
    source = request.query.get("source", "files")
    names = log_names(d.deps.paths.logs_dir)
    level_name = next((n for n, v in LEVELS.items() if v == level), "info")
    if source == "db":
        levels = tuple(n for n in ("warning", "error", "critical") if LEVELS[n] >= max(level, 30))
        with d.deps.read() as conn:
            rows = dashboard_store.log_lines(conn, 0.0, levels, service, SHOWN)
        lines = [parse(json.dumps({"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(r.at)), "level": r.level,
                                   "service": r.service, "event": r.event, **_detail(r.detail)}), r.service)
                 for r in reversed(rows)]
        lines = [line for line in lines if keeps(line, level, follow)]
    else:
        lines = await asyncio.to_thread(tail, _files(d, service), level, follow)
    return d.render(request, "logs.html", names=names, service=service, level=level_name, follow=follow,
                    source=source, lines=lines)


def _detail(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {"detail": text}
    return value if isinstance(value, dict) else {"detail": value}


class _Follower:
    """New lines of one file from where it ends now, across rotation (a new inode or a shorter file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ino, self.pos = self._stat()
        self.rest = b""

    def _stat(self) -> tuple[int, int]:
        try:
            st = os.stat(self.path)
            return st.st_ino, st.st_size
        except OSError:
            return 0, 0

    def read(self) -> list[str]:
        ino, size = self._stat()
        if ino != self.ino or size < self.pos:
            self.ino, self.pos, self.rest = ino, 0, b""
        if size <= self.pos:
            return []
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(min(size - self.pos, 4 * 1024 * 1024))
        except OSError:
            return []
        self.pos += len(data)
        data = self.rest + data
        complete, _, self.rest = data.rpartition(b"\n")
        return complete.decode("utf-8", "replace").splitlines()


async def stream(d: Dashboard, request: web.Request) -> web.StreamResponse:
    if len(d.streams) >= MAX_STREAMS:
        return web.Response(status=503, text="too many log streams open; close a tab")
    service, level, follow = _filters(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    task = asyncio.current_task()
    d.streams.add(task)
    followers: dict[Path, _Follower] = {path: _Follower(path) for path in _files(d, service)}
    started = last_sent = time.monotonic()
    try:
        await response.write(b"retry: 2000\n: following\n\n")
        while time.monotonic() - started < STREAM_MAX_S and not d.closing.is_set():
            for path in _files(d, service):  # a service that starts later shows up too
                followers.setdefault(path, _Follower(path))
            out = []
            for path, follower in followers.items():
                for raw in follower.read():
                    line = parse(raw, path.stem)
                    if line is not None and keeps(line, level, follow):
                        line.pop("raw")
                        out.append(b"data: " + json.dumps(line).encode() + b"\n\n")
            if out:
                await response.write(b"".join(out))
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent > KEEPALIVE_S:
                await response.write(b": keepalive\n\n")
                last_sent = time.monotonic()
            try:
                await asyncio.wait_for(d.closing.wait(), POLL_S)
            except asyncio.TimeoutError:
                pass
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        d.streams.discard(task)
    return response


ROUTES = [
    ("GET", "/logs", logs, "view"),
    ("GET", "/logs/stream", stream, "view"),
]
