"""Secret redaction: the secret values this process knows, and redact(), which finds them written out or encoded.

A value is found as the exact string and in the encodings a command prints without effort: reversed
(``rev``), JSON-escaped, base64 (standard or URL-safe, padded or not, at each of the three byte
alignments, so a value inside a longer blob is caught too, and wrapped over lines as ``base64``
prints it), hex (lower or upper case; contiguous, or ``xxd -p`` lines; bytes spaced, colon- or
comma-separated, with ``\\x``, ``0x`` or ``%`` before each; ``od -tx1`` with its offsets), the dumps
of ``xxd`` and ``hexdump -C`` (the hex and the ASCII column), characters one per token (``od -c``,
``fold -w1``, ``sed 's/./& /g'``) and URL-encoded (every byte, or what the usual encoders encode).

Out of reach by design: encodings of encodings (``rev | base64``), byte orders other than the
value's own (``od -x``), decimal bytes, compression, encryption. This is the second line behind
the sandbox, not the first.

How it stays fast: every form of every value is a needle, and a text is first flattened twice with
byte operations (blanks and dump offsets dropped; hex digits alone, lower-cased). A set lookup of the
flattened text's aligned 8-byte windows (``_Needles``) says whether any needle may be there at all;
only then do the regexes that find where run. A text with no secret in it costs two translations and
two lookups. The needles are built once per set of values (at the first redact() after one is added);
values in watched files (secrets.json, token files) are re-read when a file's stamp changes.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import json
import os
import re
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable
from urllib.parse import quote, quote_plus

import msgspec

REDACTED = "[redacted]"
# Values shorter than this are not redacted. Exact redaction of a 4- or 5-character value mangles
# ordinary text (a provider key set to "none", a value such as "test"), and its encodings are worse:
# the base64 of a 4-byte value at an unlucky alignment shares only 4 characters with any text that
# holds it, which would match everywhere. From 6 on, every form is at least 7 characters (42 bits or
# more); no real token is that short, and a shorter secret protects nothing by itself anyway.
MIN_SECRET_LEN = 6
REFRESH_EVERY_S = 1.0  # how stale redact()'s own look at watched files may get; refresh() looks now

_BLANKS = b" \t\r\n\v\f"
# Dump offsets at the start of a line: od's 7 octal digits; xxd's, hexdump's, od -Ax's 6-8 hex digits
_OD_OFFSET_NL = re.compile(rb"\n[0-7]{7}[ \t]")
_OD_OFFSET = re.compile(rb"(?m)^[0-7]{7}(?=[ \t])")
_HEX_OFFSET_NL = re.compile(rb"\n[0-9A-Fa-f]{6,8}:?[ \t]")
_HEX_OFFSET = re.compile(rb"(?m)^[0-9A-Fa-f]{6,8}(?=:?[ \t])")
# Hex flattened: what tools put between bytes deleted (blanks, ':' ',' and \x 0x % before a byte),
# upper case lowered, anything else a break.
_HEX_SEPARATORS = b" \t\r\n:,%\\xX"
_HEX_TABLE = bytes(
    c if chr(c) in "0123456789abcdef" else c + 32 if chr(c) in "ABCDEF" else 0 for c in range(256))

# A needle found in a flattened text is found again in the text by a pattern of its characters with
# what flattening dropped between them: one or more blanks between every two (spread one per token,
# od -c's offsets skipped), a line break here and there (wrapped), what tools print between bytes
# (hex: between digit pairs only). Possessive: a gap never gives back what it took.
_SPREAD_GAP = r"(?:[ \t]++|[ \t]*+\r?\n(?:[0-7]{7}[ \t]++)?[ \t]*+)"
_WRAP_GAP = r"(?:\r?\n)?+"
_HEX_GAP = r"(?:[ \t:,%\\xX\r\n]|0(?=[xX])|(?<=\n)[0-9A-Fa-f]{6,8}(?=:?[ \t]))*+"
# xxd and hexdump -C lines: an offset, hex groups, the ASCII column (hexdump -C puts it in |...|)
_DUMP_LINE = re.compile(
    r"(?m)^[0-9A-Fa-f]{6,16}(?::| )(?P<hex>(?: {1,2}[0-9A-Fa-f]{2,})+) {2,}(?P<asc>\|.*\||.*?)\r?$")
_DUMP_START = re.compile(r"[0-9A-Fa-f]{6,16}(?::| ) {1,2}[0-9A-Fa-f]{2}")
_DUMP_NL = re.compile(r"\n[0-9A-Fa-f]{6,16}(?::| ) {1,2}[0-9A-Fa-f]{2}")
_HEX_RUN = re.compile(r"[0-9A-Fa-f]+")
_B64_TO_URLSAFE = str.maketrans("+/", "-_")
# What URL encoders leave as it is: RFC 3986's unreserved (Python's quote), JavaScript's encodeURIComponent.
_URL_SAFE = ("", "/", "!'()*")
_GRAM = 8  # bytes; see _Needles

Span = tuple[int, int]


# ---------------------------------------------------------------- the forms of a value


def b64_cores(data: bytes) -> set[str]:
    """The base64 characters that depend on ``data`` alone, at each of the three byte alignments, standard
    and URL-safe: what any base64 text holding ``data`` contains, whatever comes before or after it."""
    cores = set()
    for k in range(3):
        encoded = base64.b64encode(b"\0" * k + data).decode()
        core = encoded[-(-8 * k // 6): 8 * (k + len(data)) // 6]
        cores.update((core, core.translate(_B64_TO_URLSAFE)))
    return cores


def forms(value: str) -> set[str]:
    """The strings that betray ``value``: as is, reversed, JSON-escaped, base64 cores, hex (both cases), its
    UTF-8 bytes as latin-1 (what a dump decodes to), URL-encoded (the usual safe sets, both hex cases)."""
    data = value.encode("utf-8", "surrogatepass")
    out = {value, value[::-1], json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
           data.hex(), data.hex().upper(), data.decode("latin-1")}
    out |= b64_cores(data)
    for safe in _URL_SAFE:
        for quoted in (quote(value, safe=safe), quote_plus(value, safe=safe)):
            out.update((quoted, re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), quoted)))
    return {f for f in out if f}


def _trie_pattern(needles: Iterable[str]) -> str:
    """A regex for any of ``needles``, the longest that matches, factored as a trie."""
    trie: dict = {}
    for needle in needles:
        node = trie
        for ch in needle:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict) -> str:
        parts = []
        for ch in sorted(k for k in node if k):
            run, child = [ch], node[ch]
            while len(child) == 1 and "" not in child:  # a chain of single children is one literal
                (nxt,) = child
                run.append(nxt)
                child = child[nxt]
            parts.append(re.escape("".join(run)) + emit(child))
        if not parts:
            return ""
        body = parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


class _Needles:
    """Says which of a set of strings may be in a text, in time that hardly grows with the set.

    A needle of 2*_GRAM-1 bytes or more holds, wherever it is in a text, one of its own _GRAM-byte
    windows at an offset of the text that is a multiple of _GRAM. So the text's aligned windows, read
    as integers straight from its bytes, are looked up in the set of all needles' windows, in one C
    loop; a hit names the needles worth searching for. Shorter needles are looked for with ``in``."""

    def __init__(self, needles: Iterable[str]) -> None:
        # A window's needles are a tuple, not a set (48 bytes against 216: nearly every window has one needle),
        # and the dict's own key view is the set looked up. Every process builds this at its first log line:
        # for a new home's 3 secrets, 1,110 windows took 395 kB with sets and a frozenset of keys, now 124 kB.
        windows: dict[int, tuple[str, ...]] = {}
        self.short: list[tuple[bytes, str]] = []
        for needle in needles:
            data = needle.encode("utf-8", "surrogatepass")
            if len(data) < 2 * _GRAM - 1:
                self.short.append((data, needle))
                continue
            for i in range(len(data) - _GRAM + 1):
                key = int.from_bytes(data[i:i + _GRAM], sys.byteorder)
                held = windows.get(key, ())
                if needle not in held:
                    windows[key] = (*held, needle)
        self.windows = windows
        self.keys = windows.keys()
        self._patterns: dict[frozenset[str], re.Pattern[str]] = {}

    def candidates(self, data: bytes) -> set[str]:
        """The needles in ``data`` (a text's UTF-8, or a flattening of it)."""
        if not self.windows and not self.short:
            return set()
        found = {needle for raw, needle in self.short if raw in data}
        aligned = memoryview(data)[: len(data) // _GRAM * _GRAM].cast("Q")
        if not self.keys.isdisjoint(aligned):
            maybe = set().union(*(self.windows[key] for key in self.keys & aligned))
            found |= {needle for needle in maybe if needle.encode("utf-8", "surrogatepass") in data}
        return found

    def pattern(self, needles: set[str]) -> re.Pattern[str]:
        key = frozenset(needles)
        pattern = self._patterns.get(key)
        if pattern is None:
            if len(self._patterns) > 256:
                self._patterns.clear()
            pattern = self._patterns[key] = re.compile(_trie_pattern(key))
        return pattern


# ---------------------------------------------------------------- finding them


def _plain_flat(data: bytes) -> bytes:
    """The text without blanks or od's offsets: any value written out, reversed, in base64 or hex, wrapped
    over lines or spread one character per token, is in it whole (unless it holds a blank itself)."""
    if _OD_OFFSET.match(data) or _OD_OFFSET_NL.search(data):
        data = _OD_OFFSET.sub(b"", data)
    return data.translate(None, _BLANKS)


def _hex_flat(data: bytes) -> bytes:
    """The text's hex digits, lower case, with what tools print between bytes (and dump offsets) dropped."""
    if _HEX_OFFSET.match(data) or _HEX_OFFSET_NL.search(data):
        data = _HEX_OFFSET.sub(b"", data)
    return data.replace(b"0x", b"").replace(b"0X", b"").translate(_HEX_TABLE, _HEX_SEPARATORS)


class Engine:
    """redact() for one fixed set of values."""

    def __init__(self, values: Iterable[str]) -> None:
        needles: set[str] = set()
        for value in values:
            needles |= forms(value)
        blank = {n for n in needles if any(c in n for c in _BLANKS.decode())}
        self.needles = _Needles(needles - blank)
        self.blank = _Needles(blank)  # never in a flattened text: looked for in the text itself
        self._tolerant: dict[tuple[str, str], re.Pattern[str]] = {}

    def redact(self, text: str) -> str:
        if len(text) < MIN_SECRET_LEN:
            return text
        if _DUMP_START.match(text) or _DUMP_NL.search(text):  # first: the others would break a dump's lines
            text = _replace(text, self._dump_spans(text))
        data = text.encode("utf-8", "surrogatepass")
        found = self.needles.candidates(_plain_flat(data)) | self.blank.candidates(data)
        if found:  # written out: replaced where it stands; what is left is spread out or wrapped over lines
            text = _replace(text, [m.span() for m in self.needles.pattern(found).finditer(text)])
            data = text.encode("utf-8", "surrogatepass")
            left = self.needles.candidates(_plain_flat(data))
            if left:
                text = _replace(text, self._gapped(text, left, _SPREAD_GAP) + self._gapped(text, left, _WRAP_GAP))
                data = text.encode("utf-8", "surrogatepass")
        hexes = {n for n in self.needles.candidates(_hex_flat(data)) if len(n) % 2 == 0}
        return _replace(text, self._gapped(text, hexes, _HEX_GAP, step=2, flags=re.IGNORECASE))

    def _gapped(self, text: str, needles: set[str], gap: str, step: int = 1, flags: int = 0) -> list[Span]:
        """Where each needle is in the text, with ``gap`` between every ``step`` of its characters; a span
        runs from its first character to its last, what lay between them with it."""
        spans: list[Span] = []
        for needle in needles:
            key = (gap, needle)
            pattern = self._tolerant.get(key)
            if pattern is None:
                if len(self._tolerant) > 256:
                    self._tolerant.clear()
                pieces = [re.escape(needle[i:i + step]) for i in range(0, len(needle), step)]
                pattern = self._tolerant[key] = re.compile(gap.join(pieces), flags)
            spans += [m.span() for m in pattern.finditer(text)]
        return spans

    def _dump_spans(self, text: str) -> list[Span]:
        """xxd and hexdump -C: the bytes of the dump lines, each known by its hex digits and by its character
        in the ASCII column; a hit covers both. (All dump lines of the text are read as one run of bytes:
        a hit across two separate dumps would be a false one, and harmless.)"""
        lines = list(_DUMP_LINE.finditer(text))
        hexes = [line.group("hex").replace(" ", "") for line in lines]
        hexes = [h if len(h) % 2 == 0 else "" for h in hexes]  # not a dump line after all
        data = bytes.fromhex("".join(hexes))
        found = self.needles.candidates(data)
        if not found:
            return []
        starts = [0, *itertools.accumulate(len(h) // 2 for h in hexes)]
        spans: list[Span] = []
        for hit in self.needles.pattern(found).finditer(data.decode("latin-1")):
            first = bisect.bisect_right(starts, hit.start()) - 1
            last = bisect.bisect_right(starts, hit.end() - 1) - 1
            for i in range(first, last + 1):
                lo, hi = max(hit.start(), starts[i]) - starts[i], min(hit.end(), starts[i + 1]) - starts[i]
                spans += _dump_line_spans(lines[i], lo, hi)
        return spans


def _dump_line_spans(line: re.Match[str], lo: int, hi: int) -> list[Span]:
    """The spans of bytes lo..hi of one dump line: their hex digits, and their characters in the ASCII column."""
    hex_at = line.start("hex")
    pairs = [hex_at + run.start() + i for run in _HEX_RUN.finditer(line.group("hex")) for i in range(0, len(run.group()), 2)]
    spans = [(pairs[lo], pairs[hi - 1] + 2)]  # the blanks between groups go with them
    column = line.group("asc")
    if column.startswith("|") and len(column) == len(pairs) + 2:  # hexdump -C
        spans.append((line.start("asc") + 1 + lo, line.start("asc") + 1 + hi))
    elif not column.startswith("|") and len(column) >= len(pairs):  # xxd: the column's last len(pairs) characters
        first = line.end("asc") - len(pairs)
        spans.append((first + lo, first + hi))
    return spans


def _replace(text: str, spans: list[Span]) -> str:
    """text with each span replaced by REDACTED; spans that overlap, touch or have only blanks between
    them become one."""
    if not spans:
        return text
    spans.sort()
    out, pos = [], 0
    start, end = spans[0]
    for s, e in spans[1:]:
        if s <= end or not text[end:s].strip(" \t"):
            end = max(end, e)
            continue
        out += [text[pos:start], REDACTED]
        pos, (start, end) = end, (s, e)
    out += [text[pos:start], REDACTED, text[end:]]
    return "".join(out)


# ---------------------------------------------------------------- the values this process knows


class Registry:
    """The secret values of one process, those from watched files included, and the engine built on them."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._engine: Engine | None = None
        self._dirty = False
        self._lock = threading.Lock()
        self._watched: dict[Path, tuple[Callable[[bytes], Iterable[str]], tuple[int, int, int] | None]] = {}
        self._checked = 0.0

    def add(self, values: Iterable[str]) -> None:
        new = set()
        for value in values:
            if isinstance(value, str):
                new.update(v for v in (value, value.strip()) if len(v) >= MIN_SECRET_LEN)
        with self._lock:
            if new - self._values:
                self._values |= new
                self._dirty = True

    def watch(self, path: Path, parse: Callable[[bytes], Iterable[str]]) -> None:
        """Add the values ``parse`` finds in ``path`` now, and again whenever the file changes."""
        with self._lock:
            self._watched[Path(path)] = (parse, None)
        self.refresh()

    def refresh(self) -> None:
        """Re-read every watched file whose inode, mtime or size changed."""
        self._checked = time.monotonic()
        for path, (parse, stamp) in list(self._watched.items()):
            try:
                st = os.stat(path)
            except OSError:
                continue
            now = (st.st_ino, st.st_mtime_ns, st.st_size)
            if now == stamp:
                continue
            try:
                values = list(parse(path.read_bytes()))
            except Exception:  # noqa: BLE001 - unreadable or corrupt now: looked at again when it changes
                values = []
            self._watched[path] = (parse, now)
            self.add(values)

    def active(self) -> bool:
        return bool(self._values) or bool(self._watched)

    def engine(self) -> Engine | None:
        if self._watched and time.monotonic() - self._checked >= REFRESH_EVERY_S:
            self.refresh()
        if self._dirty:
            with self._lock:
                if self._dirty:
                    self._engine = Engine(frozenset(self._values))
                    self._dirty = False
        return self._engine

    def redact(self, text: str) -> str:
        engine = self.engine()
        return engine.redact(text) if engine is not None else text


_registry = Registry()


def register_secret(value: str) -> None:
    """Redact ``value`` (and its encodings) from everything redacted from now on, in this process."""
    _registry.add((value,))


def register_secrets(values: Iterable[str]) -> None:
    _registry.add(values)


def watch_file(path: Path, parse: Callable[[bytes], Iterable[str]]) -> None:
    """Register the values in ``path`` now and each time the file changes (see Registry.watch)."""
    _registry.watch(path, parse)


def refresh() -> None:
    """Pick up values added to watched files since the last look, now."""
    _registry.refresh()


def active() -> bool:
    """Whether there is anything to redact (a cheap check for hot paths)."""
    return _registry.active()


def redact(text: str) -> str:
    """``text`` with every known secret value, in every form above, replaced by [redacted]."""
    return _registry.redact(text)


def redact_value(value: Any) -> Any:
    """``value`` redacted through dicts (keys too), lists, tuples (as lists) and bytes (as text)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k) if isinstance(k, str) else k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(v) for v in value]
    if isinstance(value, (bytes, bytearray)):
        return redact(bytes(value).decode("utf-8", "replace"))
    return value


def _redact_field(text: str) -> str:
    new = redact(text)
    if new == text or text[:1] not in ("{", "["):
        return new
    # JSON held in a text field (meta, arguments): redacted value by value, so it stays JSON
    try:
        parsed = json.loads(text)
    except ValueError:
        return new
    again = json.dumps(redact_value(parsed), ensure_ascii=False)
    return again if redact(again) == again else new


def redact_struct(obj: Any) -> Any:
    """A msgspec Struct (a bus message) with every text field redacted, recursively; unchanged parts are
    the same objects, and the same message comes back when nothing was found."""
    if isinstance(obj, str):
        return _redact_field(obj)
    if isinstance(obj, msgspec.Struct):
        changes = {}
        for name in obj.__struct_fields__:
            value = getattr(obj, name)
            new = redact_struct(value)
            if new is not value and new != value:
                changes[name] = new
        return msgspec.structs.replace(obj, **changes) if changes else obj
    if isinstance(obj, (list, tuple)):
        items = [redact_struct(v) for v in obj]
        return type(obj)(items) if any(a is not b for a, b in zip(items, obj)) else obj
    if isinstance(obj, dict):
        new_dict = {k: redact_struct(v) for k, v in obj.items()}
        return new_dict if any(new_dict[k] is not v for k, v in obj.items()) else obj
    return obj
