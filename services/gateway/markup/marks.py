"""Reading marker markup (Slack's and WhatsApp's) into atoms for the splitter: which markers pair, where code runs.

*bold*, _italic_, ~strike~, `code`, ```blocks``` and "> " quotes, as both apps read them.
"""

from __future__ import annotations

import re
from typing import Final

from services.gateway.markup.split import Atom, Measure, text_atoms

FENCE: Final = "```"
# `code`: no other backtick touching either end, no space just inside (so a split's added ` can
# never meet another backtick and make a fence)
CODE_PAIR_RE: Final = r"(?<!`)`[^`\s](?:[^`\n]*[^`\s])?`(?!`)"
_CODE_PAIR = re.compile(CODE_PAIR_RE)
HIDDEN: Final = "\ufffc"  # stands for a <...> token or entity: never a word character or marker


def pairs(line: str) -> list[tuple[int, int, str]]:
    """The (open, close, marker) pairs the app formats in one line, outermost first.

    Code spans first (`...`, see CODE_PAIR_RE); then * _ ~ outside them, read left to right: a
    marker opens with no letter, digit or like marker before it and no space after; it closes with
    no space before and no letter, digit or like marker after, pairing with the open marker of its
    kind. One marker of a kind is open at a time, and a close drops opens made after its own
    opener, so pairs nest and never cross: at most four (` * _ ~) are open anywhere.
    """
    found = [(m.start(), m.end() - 1, "`") for m in _CODE_PAIR.finditer(line)]
    chars = list(line)
    for o, c, _ in found:
        chars[o : c + 1] = HIDDEN * (c + 1 - o)
    stack: list[tuple[str, int]] = []
    last = len(chars) - 1
    for p, ch in enumerate(chars):
        if ch not in "*_~":
            continue
        before = chars[p - 1] if p else " "
        after = chars[p + 1] if p < last else " "
        if not before.isspace() and before != ch and not after.isalnum() and after != ch:
            opened = next((k for k, (mark, _) in enumerate(stack) if mark == ch), None)
            if opened is not None:
                found.append((stack[opened][1], p, ch))
                del stack[opened:]
                continue
        if not before.isalnum() and before != ch and not after.isspace() and after != ch:
            if all(mark != ch for mark, _ in stack):
                stack.append((ch, p))
    return sorted(found, key=lambda f: (f[0], -f[1]))


def _mask(atom: Atom) -> str:
    """One character standing for an atom, as `pairs` reads it."""
    return HIDDEN if atom.kind == "text" and len(atom.raw) > 1 and atom.raw[0] in "<&" else atom.raw[0]


def atoms(text: str, measure: Measure, token: str = "") -> list[Atom]:
    """Marker markup as atoms: each match of `token` (a regex: links, entities) is one text atom; a
    fence opens or closes a code block (verbatim; a part closes it with "\\n```" and reopens it
    with "```\\n"); the markers `pairs` finds and a line's "> " quote mark are open/close atoms."""
    pattern = re.compile(f"(?:{token})|{FENCE}" if token else FENCE)
    out: list[Atom] = []
    inside = False
    line: list[int] = []  # out's indices for the line being read (outside code)
    drop: set[int] = set()
    closes: dict[int, Atom] = {}  # a quote's close, after that index
    pair = code = 0  # the last pair, the open code block's

    def read() -> None:
        nonlocal pair
        quoted = len(line) > 2 and out[line[0]].raw == ">" and out[line[1]].raw == " "
        for o, c, mark in pairs("".join(_mask(out[k]) for k in line)):
            pair += 1
            a, b = out[line[o]], out[line[c]]
            out[line[o]] = Atom("open", a.raw, a.size, pair, mark, mark)
            out[line[c]] = Atom("close", b.raw, b.size, pair)
        if quoted:
            pair += 1
            out[line[0]] = Atom("open", "> ", measure("> "), pair, "", "> ")
            drop.add(line[1])
            last = next(k for k in reversed(line) if out[k].kind != "space")  # so "  \n\n" stays one run
            closes[last] = Atom("close", "", 0, pair)
        line.clear()

    def plain(piece: str) -> None:
        start = len(out)
        text_atoms(piece, measure, out)
        for k in range(start, len(out)):
            if inside:
                continue
            if out[k].raw == "\n":
                read()
            else:
                line.append(k)

    pos = 0
    for m in pattern.finditer(text):
        plain(text[pos : m.start()])
        pos = m.end()
        if m.group() != FENCE:
            out.append(Atom("text", m.group(), measure(m.group())))
            if not inside:
                line.append(len(out) - 1)
        elif not inside:
            read()
            pair = code = pair + 1
            out.append(Atom("open", FENCE, measure(FENCE), code, "\n" + FENCE, FENCE + "\n", verbatim=True))
            inside = True
        else:
            newline = out[-1].raw == "\n" and out[-1].kind == "space"
            if newline:
                out.pop()
            raw = "\n" * newline + FENCE
            out.append(Atom("close", raw, measure(raw), code))
            inside = False
    plain(text[pos:])
    read()
    result: list[Atom] = []
    for k, a in enumerate(out):
        if k not in drop:
            result.append(a)
        if k in closes:
            result.append(closes[k])
    return result

