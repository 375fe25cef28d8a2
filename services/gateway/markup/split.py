"""One splitter for every platform: a rendered message, read into atoms by its renderer, cut to a limit.

An atom is never cut: a character cluster (a letter and its marks, an emoji sequence, a flag), an
entity, a link token, a tag or marker. A renderer turns its output into atoms (text, space, and
open/close pairs that say how a part closes and reopens them); `split` does the rest:

- breaks prefer a blank line, then a newline, then the space after a sentence, then any space,
  among those in the part's second half (the whitespace at a break is dropped); else a part ends
  between two atoms, never just after an opener;
- pairs open at a break are closed at the end of the part and reopened at the start of the next;
  inside a verbatim pair (a code block) a break takes one newline only, so indentation stays, and
  never leaves the block without text;
- a pair too large to repeat within the limit is dropped and its text kept.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, Final, Literal, NamedTuple

Measure = Callable[[str], int]

MIN_LIMIT: Final = 32  # room for a few nested pairs plus the largest atom
_MARGIN: Final = 16  # the largest atom but a token (an entity, a cluster of 8 code points) fits in this
_MAX_CLUSTER: Final = 8  # code points kept together
_SPACES: Final = frozenset(" \t\n")
_SENTENCE_END: Final = frozenset(".!?…")
_ZWJ: Final = "\u200d"
_MARKS: Final = "\u0300"  # no character below this joins the one before it (but after a ZWJ)
_ASTRAL: Final = "\U00010000"
ENTITY: Final = r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,9});"


def utf16_len(text: str) -> int:
    """Length of `text` in UTF-16 code units (astral characters count 2); never under len(text)."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


class Atom(NamedTuple):  # a tuple: messages run to 10⁵ atoms
    kind: Literal["text", "space", "open", "close"]
    raw: str
    size: int  # raw in the platform's measure
    pair: int = -1  # links an open atom to its close atom
    closer: str = ""  # open: what ends a part it is open in
    reopen: str = ""  # open: what starts the next part
    verbatim: bool = False  # open: a code block


@dataclass(frozen=True, slots=True)
class Part:
    head: str  # the reopened pairs
    body: str  # the message's own text
    tail: str  # the closed pairs

    def __str__(self) -> str:
        return self.head + self.body + self.tail


@dataclass(frozen=True, slots=True)
class _Break:
    at: int  # atom index of the whitespace where the part may end
    pieces: int  # body pieces before it
    used: int  # part size there, without closers
    stack: tuple[Atom, ...]


def _regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _joins(cluster: str, ch: str) -> bool:
    """Whether `ch` belongs with the characters before it: a mark, joiner, modifier, flag half."""
    if cluster[-1] == _ZWJ:
        return True
    if _regional(ch):
        return len(cluster) == 1 and _regional(cluster)
    cp = ord(ch)
    return (
        ch == _ZWJ
        or unicodedata.category(ch) in ("Mn", "Mc", "Me")
        or 0xFE00 <= cp <= 0xFE0F  # variation selectors
        or 0x1F3FB <= cp <= 0x1F3FF  # skin tones
        or 0xE0020 <= cp <= 0xE007F  # emoji tag sequences
        or 0xE0100 <= cp <= 0xE01EF
    )


_SPACE_ATOMS: Final = {ch: Atom("space", ch, 1) for ch in _SPACES}
_BMP: dict[str, Atom] = {}  # one atom per character seen (atoms are immutable)


def text_atoms(text: str, measure: Measure, atoms: list[Atom] | None = None) -> list[Atom]:
    """`text` as cluster and space atoms, appended to `atoms`."""
    atoms = [] if atoms is None else atoms

    def add(cluster: str) -> None:  # a lone character of the BMP is 1 in either measure
        if len(cluster) == 1 and cluster < _ASTRAL:
            atoms.append(_BMP.get(cluster) or _BMP.setdefault(cluster, Atom("text", cluster, 1)))
        else:
            atoms.append(Atom("text", cluster, measure(cluster)))

    cluster = ""
    for ch in text:
        if ch in _SPACES:
            if cluster:
                add(cluster)
                cluster = ""
            atoms.append(_SPACE_ATOMS[ch])
        elif cluster and (ch >= _MARKS or cluster[-1] == _ZWJ) and len(cluster) < _MAX_CLUSTER and _joins(cluster, ch):
            cluster += ch
        else:
            if cluster:
                add(cluster)
            cluster = ch
    if cluster:
        add(cluster)
    return atoms


def _run_end(atoms: list[Atom], at: int) -> int:
    while at < len(atoms) and atoms[at].kind == "space":
        at += 1
    return at


def _verbatim(stack: list[Atom] | tuple[Atom, ...]) -> bool:
    return any(a.verbatim for a in stack)


def _priority(atoms: list[Atom], brk: _Break) -> int:
    if _verbatim(brk.stack):
        return 2
    newlines = sum(a.raw == "\n" for a in atoms[brk.at : _run_end(atoms, brk.at)])
    if newlines:
        return 3 if newlines >= 2 else 2
    k = brk.at - 1
    while k >= 0 and atoms[k].kind == "close":
        k -= 1
    return 1 if k >= 0 and atoms[k].kind == "text" and atoms[k].raw[-1] in _SENTENCE_END else 0


def _choose(atoms: list[Atom], breaks: list[_Break], used: int) -> _Break | None:
    """The best break among those in the part's second half, the latest of its kind; else the last."""
    for priority in (3, 2, 1, 0):
        for brk in reversed(breaks):
            if brk.used * 2 >= used and _priority(atoms, brk) == priority:
                return brk
    return breaks[-1] if breaks else None


def _trailing_space(atoms: list[Atom]) -> list[bool]:
    """Per atom: a space with only spaces after it until a close atom (or the end)."""
    flags = [False] * len(atoms)
    following = True
    for k in range(len(atoms) - 1, -1, -1):
        kind = atoms[k].kind
        flags[k] = kind == "space" and following
        following = kind == "close" or flags[k]
    return flags


@dataclass(slots=True)
class _Chunk:
    """The part being filled."""

    head: str
    used: int
    closing: int
    pieces: list[str] = field(default_factory=list)
    index: list[int] = field(default_factory=list)  # the atom behind each piece

    def take(self, atoms: list[Atom], i: int) -> None:
        self.pieces.append(atoms[i].raw)
        self.index.append(i)
        self.used += atoms[i].size


def split(atoms: list[Atom], limit: int, measure: Measure = utf16_len) -> list[Part]:
    """`atoms` in parts of at most `limit` (in `measure`), each valid on its own; whitespace-only
    parts are left out, so no atoms give []."""
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}, got {limit}")

    def overhead(stack: list[Atom]) -> int:
        return sum(measure(a.reopen) + measure(a.closer) for a in stack)

    trailing = _trailing_space(atoms)
    parts: list[Part] = []
    skipped: set[int] = set()
    stack: list[Atom] = []  # invariant: overhead(stack) + _MARGIN <= limit
    i = 0
    while i < len(atoms):
        start = i
        head = "".join(a.reopen for a in stack)
        chunk = _Chunk(head, measure(head), sum(measure(a.closer) for a in stack))
        has_text = False  # in this part; inside a code block, since it (re)opened
        breaks: list[_Break] = []
        full = False
        code = _verbatim(stack)
        while i < len(atoms):
            a = atoms[i]
            if a.kind == "close":
                if a.pair not in skipped:
                    chunk.take(atoms, i)
                    chunk.closing -= measure(stack.pop().closer)
                    code = _verbatim(stack)
                i += 1
                continue
            if a.kind == "open":
                cost = a.size + measure(a.closer)
                if overhead(stack) + measure(a.reopen) + measure(a.closer) + _MARGIN > limit:
                    skipped.add(a.pair)
                    i += 1
                    continue
                if chunk.used + chunk.closing + cost > limit:
                    full = True
                    break
                chunk.take(atoms, i)
                stack.append(a)
                chunk.closing += measure(a.closer)
                has_text = has_text and not a.verbatim
                code = code or a.verbatim
                i += 1
                continue
            if a.kind == "space" and has_text:
                if code:  # a newline, the first of its run, with more code after it
                    at = a.raw == "\n" != atoms[i - 1].raw and not trailing[i]
                else:  # the first space after text
                    at = atoms[i - 1].kind not in ("space", "open")
                if at:
                    breaks.append(_Break(i, len(chunk.pieces), chunk.used, tuple(stack)))
            if chunk.used + chunk.closing + a.size > limit:
                if code and trailing[i]:  # whitespace ending a code block goes when it does not fit
                    i = _run_end(atoms, i)
                    continue
                full = True
                break
            chunk.take(atoms, i)
            has_text = has_text or a.kind == "text"
            i += 1
        pieces = len(chunk.pieces)
        brk = _choose(atoms, breaks, chunk.used) if full else None
        if brk is not None:
            pieces, stack = brk.pieces, list(brk.stack)
            i = _run_end(atoms, brk.at)
            if _verbatim(stack):  # the blank lines go, the next line's indentation stays
                i = max(k for k in range(brk.at, i) if atoms[k].raw == "\n") + 1
        elif full:
            pieces = _back_off(atoms, chunk)
            if pieces < len(chunk.pieces):
                i = chunk.index[pieces]
                del stack[len(stack) - sum(atoms[k].kind == "open" for k in chunk.index[pieces:]) :]
        body = "".join(chunk.pieces[:pieces])
        if body.strip():
            parts.append(Part(head, body, "".join(a.closer for a in reversed(stack))))
        assert i > start, "split made no progress"
    return parts


def _back_off(atoms: list[Atom], chunk: _Chunk) -> int:
    """How many pieces to keep at a hard break: a part does not end on an opener (or on one and the
    whitespace after it), unless that would leave it empty."""
    k = len(chunk.pieces)
    while k and atoms[chunk.index[k - 1]].kind == "space":
        k -= 1
    if not (k and atoms[chunk.index[k - 1]].kind == "open"):
        return len(chunk.pieces)
    while k and atoms[chunk.index[k - 1]].kind == "open":
        k -= 1
    return k if "".join(chunk.pieces[:k]).strip() else len(chunk.pieces)


def split_text(atoms: list[Atom], limit: int, measure: Measure = utf16_len) -> list[str]:
    """`split`, each part as one string."""
    return [str(part) for part in split(atoms, limit, measure)]


def tokens(text: str, pattern: re.Pattern[str], measure: Measure, token: Callable[[str], list[Atom]]) -> list[Atom]:
    """`text` as atoms: each match of `pattern` as `token` makes it, the text between as clusters and spaces."""
    atoms: list[Atom] = []
    pos = 0
    for m in pattern.finditer(text):
        text_atoms(text[pos : m.start()], measure, atoms)
        atoms += token(m.group())
        pos = m.end()
    return text_atoms(text[pos:], measure, atoms)
