"""`starling logs [SERVICE] [-f] [-n N] [--since T] [--level L]`: services' JSON log lines rendered for people,
merged by time (every service's when none is named), filtered by time and level, followed across rotation."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Callable, Iterable

from common.cli import output
from common.cli.context import Context
from common.errors import StarlingError

POLL_S = 0.2
RESCAN_S = 1.0  # how often a followed group looks for new members (a runner added later)
_LEVEL_COLOUR = {"DEBUG": "dim", "INFO": "green", "WARN": "yellow", "ERROR": "red", "CRIT": "red"}
_LEVEL_TEXT = {"warning": "WARN", "critical": "CRIT", "exception": "ERROR", "fatal": "CRIT"}
_HEAD_KEYS = ("ts", "level", "service", "event", "pid")
_BLOCK_KEYS = ("exception", "stack")  # multi-line values, printed indented below the line

Emit = Callable[[str, str], None]  # (file stem, raw line)


def register(verbs) -> None:
    logs = verbs.add_parser(
        "logs", help="show services' logs (data/logs/*.log) merged by time, optionally following them",
        description="SERVICE is a log's name (writer, runner-0, ...) or a group prefix: `runner` merges "
                    "runner-0, runner-1, ... by time; with none, every service's log (not supervisord's own). "
                    "--since and --level read the whole files, rotated ones too.",
    )
    logs.add_argument("service", metavar="SERVICE", nargs="?", help="a service name, or a prefix such as runner or"
                      " gateway (default: every service)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (Ctrl-C stops)")
    logs.add_argument("-n", "--lines", type=_count, default=None, metavar="N",
                      help="show the last N lines (default 50; with --since, every line since)")
    logs.add_argument("--since", type=_since, metavar="T", help="lines from this time on: 30s, 10m, 2h, 1d ago, or a"
                      " local date and time such as 2026-12-01T09:00 (or a date)")
    logs.add_argument("--level", type=_level, metavar="L", help="lines at this level or above: debug, info, warning,"
                      " error, critical")
    logs.add_argument("--json", action="store_true", help="print the raw JSON lines")
    logs.add_argument("--db", action="store_true", help="the warnings and errors every service stored in the"
                      " database (daemon_log): no log file needed")
    logs.set_defaults(func=cmd_logs)


LEVELS = {"debug": 10, "info": 20, "warn": 30, "warning": 30, "error": 40, "exception": 40, "critical": 50,
          "crit": 50, "fatal": 50}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _since(text: str) -> str:
    """The ISO UTC time (as the log lines write ``ts``) that --since names."""
    number, unit = text[:-1], text[-1:].lower()
    if unit in _UNITS and number.replace(".", "", 1).isdigit():
        moment = datetime.now(timezone.utc) - timedelta(seconds=float(number) * _UNITS[unit])
    else:
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected 30s, 10m, 2h, 1d or a date and time, got {text!r}") from None
        moment = moment.astimezone(timezone.utc)  # a naive time is local
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _level(text: str) -> int:
    try:
        return LEVELS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected debug, info, warning, error or critical, got {text!r}") from None


def keeps(raw: str, since: str | None, level: int | None) -> bool:
    """Whether a line passes --since and --level (a line that is not a JSON object with ts and level does not)."""
    if since is None and level is None:
        return True
    try:
        event = json.loads(raw)
    except ValueError:
        return False
    if not isinstance(event, dict):
        return False
    if since is not None and not (isinstance(event.get("ts"), str) and event["ts"] >= since):
        return False
    return level is None or LEVELS.get(str(event.get("level", "")).lower(), 0) >= level


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


# ------------------------------------------------------------------ finding logs


def available(logs_dir: Path) -> list[str]:
    """The names of the logs in logs_dir (current files only, not rotated ones)."""
    if not logs_dir.is_dir():
        return []
    return sorted(p.stem for p in logs_dir.glob("*.log") if p.is_file())


def service_logs(logs_dir: Path) -> list[Path]:
    """Every service's current log (supervisord's own, not a service's, is left out)."""
    return [logs_dir / f"{name}.log" for name in available(logs_dir) if name != "supervisord"]


def with_rotated(path: Path) -> list[Path]:
    """A log and its rotated backups, oldest first (supervisord: NAME.log.1 is the newest backup)."""
    backups = []
    n = 1
    while (candidate := path.with_name(f"{path.name}.{n}")).is_file():
        backups.append(candidate)
        n += 1
    return [*reversed(backups), path]


def filtered(files: list[Path], n: int | None, since: str | None, level: int | None) -> list[tuple[str, str]]:
    """Every line of the files (rotated ones too) that passes the filters, merged by ts; the last n."""
    keyed = []
    for index, path in enumerate(files):
        for seq, line in enumerate(line for part in with_rotated(path)
                                   for line in part.read_text(errors="replace").splitlines()):
            if keeps(line, since, level):
                keyed.append((_sort_key(line), index, seq, path.stem, line))
    keyed.sort(key=lambda item: (item[0], item[1], item[2]))
    chosen = keyed if n is None else keyed[-n:] if n else []
    return [(stem, line) for _, _, _, stem, line in chosen]


def log_files(logs_dir: Path, service: str) -> list[Path]:
    """SERVICE.log if it exists, else every SERVICE-*.log (a group such as runner-0, runner-1)."""
    service = service.removesuffix(".log")
    exact = logs_dir / f"{service}.log"
    if exact.is_file():
        return [exact]
    return sorted(p for p in logs_dir.glob(f"{_escape(service)}-*.log") if p.is_file())


def _escape(text: str) -> str:
    return "".join(f"[{c}]" if c in "*?[]" else c for c in text)


# ------------------------------------------------------------------ rendering


def _sort_key(raw: str) -> str:
    try:
        value = json.loads(raw)
    except ValueError:
        return ""
    ts = value.get("ts") if isinstance(value, dict) else None
    return ts if isinstance(ts, str) else ""


def _clock(ts: object) -> str:
    if not isinstance(ts, str):
        return "--:--:--"
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return ts


def _value(value: object) -> str:
    if isinstance(value, str):
        if value and not any(c.isspace() or c in "\"'=" for c in value):
            return value
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def render(raw: str, service: str = "", colour: bool = False) -> str:
    """`HH:MM:SS LEVEL service event key=value ...` (local time); a line that is not a JSON object as it is."""
    try:
        event = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(event, dict):
        return raw
    level = str(event.get("level", "")).lower()
    level = _LEVEL_TEXT.get(level, level.upper()) or "-"
    level_text = level.ljust(5)
    if colour and level in _LEVEL_COLOUR:
        level_text = f"\033[{_COLOUR_CODES[_LEVEL_COLOUR[level]]}m{level_text}\033[0m"
    parts = [_clock(event.get("ts")), level_text, str(event.get("service") or service), str(event.get("event", ""))]
    blocks = []
    for key, value in event.items():
        if key in _HEAD_KEYS:
            continue
        if key in _BLOCK_KEYS and isinstance(value, str) and "\n" in value:
            blocks.append(value.rstrip("\n"))
            continue
        parts.append(f"{key}={_value(value)}")
    text = " ".join(p for p in parts if p)
    for block in blocks:
        text += "\n" + "\n".join("    " + line for line in block.splitlines())
    return text


_COLOUR_CODES = {"green": "32", "red": "31", "yellow": "33", "dim": "2"}


# ------------------------------------------------------------------ reading


def tail(path: Path, n: int, end: int | None = None, chunk: int = 65536) -> list[str]:
    """The last n lines of path before byte offset ``end`` (default: the end of the file)."""
    if n <= 0:
        return []
    with open(path, "rb") as fh:
        pos = fh.seek(0, os.SEEK_END) if end is None else end
        data = b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(chunk, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    lines = data.decode("utf-8", "replace").splitlines()
    return lines[-n:]


def merged_tail(files: list[Path], n: int, ends: dict[Path, int] | None = None) -> list[tuple[str, str]]:
    """The last n lines over several files, merged by their ``ts`` (each file's own order is kept)."""
    keyed: list[tuple[str, int, int, str, str]] = []
    for index, path in enumerate(files):
        last = ""
        for seq, line in enumerate(tail(path, n, (ends or {}).get(path))):
            last = _sort_key(line) or last  # a line without ts sorts with the line before it
            keyed.append((last, index, seq, path.stem, line))
    if len(files) > 1:
        keyed.sort(key=lambda item: (item[0], item[1], item[2]))
    return [(stem, line) for _, _, _, stem, line in keyed[-n:]] if n else []


class Tracked:
    """One followed file: reads what was appended, and reopens when it is rotated or truncated."""

    def __init__(self, path: Path, from_start: bool) -> None:
        self.path = path
        self.fh = None
        self.ident: tuple[int, int] | None = None
        self.partial = b""
        self._open(from_start)

    def _open(self, from_start: bool) -> None:
        try:
            fh = open(self.path, "rb")
        except FileNotFoundError:
            return
        st = os.fstat(fh.fileno())
        self.ident = (st.st_dev, st.st_ino)
        if not from_start:
            fh.seek(0, os.SEEK_END)
        self.fh = fh
        self.partial = b""

    @property
    def position(self) -> int:
        return self.fh.tell() if self.fh else 0

    def _read(self, final: bool = False) -> list[str]:
        data = self.partial + self.fh.read()
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        return [line.decode("utf-8", "replace") for line in lines]

    def poll(self) -> list[str]:
        if self.fh is None:
            self._open(from_start=True)
            if self.fh is None:
                return []
        lines = self._read()
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return lines  # renamed away and not yet recreated: keep the old file until it is
        if (st.st_dev, st.st_ino) != self.ident:
            lines += self._read(final=True)  # the last lines written before the rotation
            self.fh.close()
            lines += self._rotated_after(self.ident)
            self._open(from_start=True)
            if self.fh is not None:
                lines += self._read()
        elif st.st_size < self.fh.tell():  # truncated in place
            self.fh.seek(0)
            self.partial = b""
            lines += self._read()
        return lines

    def _rotated_after(self, ident: tuple[int, int] | None) -> list[str]:
        """Whole files rotated after ours between two polls (supervisord: NAME.1 is the newest backup).

        Our old file is now NAME.k; NAME.k-1 ... NAME.1 were written after it, oldest first. When
        ours is gone (pushed past the last backup), every backup left is newer than it.
        """
        backups = []
        n = 1
        while (candidate := self.path.with_name(f"{self.path.name}.{n}")).exists():
            backups.append(candidate)
            n += 1
        newer = []
        for candidate in backups:
            st = candidate.stat()
            if (st.st_dev, st.st_ino) == ident:
                break
            newer.append(candidate)
        lines: list[str] = []
        for candidate in reversed(newer):
            data = candidate.read_bytes()
            lines += [line.decode("utf-8", "replace") for line in data.split(b"\n") if line]
        return lines

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def follow(
    find_files: Callable[[], Iterable[Path]],
    emit: Emit,
    stop: Callable[[], bool] = lambda: False,
    poll_s: float = POLL_S,
    max_s: float | None = None,
    tracked: dict[Path, Tracked] | None = None,
) -> None:
    """Emit lines appended to the files ``find_files()`` names until ``stop()`` is true or ``max_s`` passed.

    Files found later are read from their start. Each poll's lines are emitted in ``ts`` order.
    """
    tracked = dict(tracked or {})
    deadline = None if max_s is None else time.monotonic() + max_s
    next_scan = 0.0
    try:
        while True:
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + RESCAN_S
                for path in find_files():
                    if path not in tracked:
                        tracked[path] = Tracked(path, from_start=True)
            batch = []
            for path, tr in tracked.items():
                for line in tr.poll():
                    batch.append((_sort_key(line), len(batch), path.stem, line))
            if len(tracked) > 1:
                batch.sort(key=lambda item: (item[0], item[1]))
            for _, _, stem, line in batch:
                emit(stem, line)
            if stop() or (deadline is not None and time.monotonic() >= deadline):
                return
            time.sleep(poll_s)
    finally:
        for tr in tracked.values():
            tr.close()


# ------------------------------------------------------------------ the verb


def cmd_logs(args: argparse.Namespace) -> int:
    if getattr(args, "db", False):
        from common.cli import logs_db

        return logs_db.show(args)
    ctx = Context.from_args(args)
    logs_dir = ctx.paths.logs_dir
    if args.service:
        def find() -> list[Path]:
            return log_files(logs_dir, args.service)
    else:
        def find() -> list[Path]:
            return service_logs(logs_dir)
    files = find()
    if not files:
        names = available(logs_dir)
        listing = f"available: {', '.join(names)}" if names else "no logs yet (they appear once `starling up` ran)"
        raise StarlingError(f"no log for {args.service!r} in {logs_dir}; {listing}" if args.service
                            else f"no service log in {logs_dir}; {listing}")
    colour = output.use_colour()
    filtering = args.since is not None or args.level is not None

    def emit(stem: str, line: str) -> None:
        if keeps(line, args.since, args.level):
            print(line if args.json else render(line, stem, colour), flush=args.follow)

    try:
        # open before reading the tail, so that nothing written in between is missed or repeated
        tracked = {path: Tracked(path, from_start=False) for path in files} if args.follow else {}
        ends = {path: tr.position for path, tr in tracked.items()}
        if filtering:
            lines = args.lines if args.lines is not None else (None if args.since else 50)
            shown = filtered(files, lines, args.since, args.level)
        else:
            shown = merged_tail(files, 50 if args.lines is None else args.lines, ends)
        for stem, line in shown:
            emit(stem, line)
        if args.follow:
            single = bool(args.service) and len(files) == 1 and files[0].stem == args.service.removesuffix(".log")
            follow(lambda: files if single else find(), emit, tracked=tracked)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:  # `starling logs writer | head`: stop quietly, also at interpreter exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0
