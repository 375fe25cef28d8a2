"""The files a gateway keeps what it holds in, as `status` and doctor read them: its spool of events
acknowledged before the writer stored them (services/gateway/spool.py appends to it), and its dead
letters kept in a file while the writer could not take them (services/gateway/dead_letters.py)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

SPOOL_SUFFIX = ".spool"
DEAD_LETTER_SUFFIX = ".jsonl"


@dataclass
class SpoolEntry:
    seq: int
    instance: str
    key: str
    event: dict
    at: float = field(default_factory=time.time)
    spooled: bool = False
    durable: asyncio.Future | None = None


def read_spool(path: Path) -> tuple[list[SpoolEntry], int]:
    """(the events in the file not marked done, in order; the highest seq seen)."""
    entries: dict[int, SpoolEntry] = {}
    top = 0
    try:
        lines = path.read_bytes().splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return [], 0
    for line in lines:
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):  # a torn last line: never fsynced, never acknowledged
            continue
        if not isinstance(row, dict):
            continue
        if isinstance(row.get("done"), int):
            entries.pop(row["done"], None)
        elif isinstance(row.get("seq"), int) and isinstance(row.get("event"), dict):
            entries[row["seq"]] = SpoolEntry(row["seq"], str(row.get("instance", "")), str(row.get("key", "")),
                                        row["event"], float(row.get("at") or 0.0), spooled=True)
        top = max(top, row.get("seq", 0) if isinstance(row.get("seq"), int) else 0)
    return sorted(entries.values(), key=lambda e: e.seq), top


def spool_sizes(folder: Path) -> dict[str, tuple[int, int]]:
    """Every spool under ``folder``: process name -> (events not yet stored, bytes), for `status` and doctor."""
    found = {}
    try:
        paths = sorted(p for p in folder.iterdir() if p.name.endswith(SPOOL_SUFFIX))
    except FileNotFoundError:
        return {}
    for path in paths:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            continue
        found[path.name[:-len(SPOOL_SUFFIX)]] = (len(read_spool(path)[0]), size)
    return found


def dead_letter_files(folder: Path) -> list[Path]:
    try:
        return sorted(p for p in folder.iterdir() if p.name.endswith(DEAD_LETTER_SUFFIX))
    except FileNotFoundError:
        return []


def dead_letters_in_files(folder: Path) -> int:
    """Dead letters waiting in files (the writer could not take them), for status and doctor."""
    total = 0
    for path in dead_letter_files(folder):
        try:
            total += sum(1 for line in path.read_bytes().splitlines() if line.strip())
        except OSError:
            continue
    return total
