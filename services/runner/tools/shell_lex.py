"""A conservative lexer for shell command lines: words (and which of their characters are quoted), operators,
the command substitutions inside, the simple commands they make, and bash's brace expansion of a word.

It exists for the approval classes (classify.py), not to run anything: where it cannot follow bash it
errs toward seeing *more* code (an unquoted region bash would treat as text), never less, and it
raises ParseError on what it cannot read (unterminated quotes, unbalanced parentheses). Covered:
'single', "double" (with $(…), `…` and $var inside), $'ANSI-C', \\ escapes and line continuations,
comments, $(…), `…`, <(…) >(…), $((…)), ${…} (its contents are lexed like the rest), fd-prefixed
redirections (2>, 2>&1), heredoc operators (their bodies are lexed as commands: bash expands them).

Each word carries a mask, one letter per character of its text: ``u`` unquoted, ``q`` quoted, ``e``
escaped by a backslash, ``x`` part of an expansion ($NAME, ${NAME}, a substitution's placeholder), ``o``
the brace that opens a ``${…}`` with operators. Pattern characters, tilde prefixes and brace expansion are judged
on the unquoted characters only, as bash does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SUB = "\x00"  # stands for a substitution's output inside a word (a command cannot contain NUL)
MAX_BRACE = 1024  # words one brace expansion may produce before the check gives up
OPS = sorted(
    ["&>>", "<<<", ";;&", "<<-", ";;", ";&", "&&", "||", "|&", ">>", ">|", "<<", "<>", "&>", ">&", "<&",
     ";", "&", "|", "(", ")", "<", ">"],
    key=len, reverse=True,
)
_OP_CHARS = set(";&|()<>")
_SIMPLE_BRACED = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SPECIAL = set("?$!#@*-0123456789")


class ParseError(Exception):
    """The command line cannot be read reliably."""


class TooMany(Exception):
    """An expansion would produce more words than a check may look at."""


@dataclass
class Word:
    text: str = ""
    mask: str = ""  # one of u q e x o per character of text (see the module doc)
    quoted: bool = False  # some part was quoted or escaped (also an empty "" or '')
    unknown: bool = False  # a part bash computes that we cannot: substitution, $'…', ${…} with operators
    ansi: bool = False  # holds a $'…' part (its escapes are not decoded here)
    vars: set[str] = field(default_factory=set)  # simple $NAME / ${NAME} references
    subs: list[int] = field(default_factory=list)  # indexes into the lexer's substitutions
    empties: list[int] = field(default_factory=list)  # where in text an empty '' or "" stood (brace expansion sees it)

    @classmethod
    def plain(cls, text: str) -> Word:
        return cls(text=text, mask="u" * len(text))

    def add(self, text: str, kind: str) -> None:
        self.text += text
        self.mask += kind * len(text)
        self.quoted = self.quoted or kind in "qe"

    def tail(self, start: int) -> Word:
        """The word made of text[start:] (an option's glued argument, the value after NAME=)."""
        empties = [e - start for e in self.empties if e >= start]
        return Word(text=self.text[start:], mask=self.mask[start:], quoted=bool(set(self.mask[start:]) & {"q", "e"})
                    or bool(empties), unknown=self.unknown, ansi=self.ansi, vars=set(self.vars), subs=list(self.subs),
                    empties=empties)

    @property
    def glob(self) -> bool:
        return glob_index(self) >= 0

    @property
    def tilde(self) -> bool:
        return self.text[:1] == "~" and self.mask[:1] == "u"

    @property
    def computed(self) -> bool:
        """Some part is an expansion bash does at run time ($x, ${…}, $(…), $'…')."""
        return self.unknown or self.ansi or bool(self.vars) or SUB in self.text or "x" in self.mask


def glob_index(word: Word, start: int = 0) -> int:
    """Index of the first unquoted pattern character (* ? or a [ closed later), or -1."""
    t, m = word.text, word.mask
    for i in range(start, len(t)):
        if m[i] == "u" and (t[i] in "*?" or (t[i] == "[" and "]" in t[i + 1:])):
            return i
    return -1


@dataclass(frozen=True)
class Op:
    text: str  # an operator from OPS, a redirection possibly with its fd ("2>"), or ";" for a newline


Token = Word | Op


def capture_paren(s: str, start: int) -> tuple[str, int]:
    """The text from ``start`` up to the ``)`` that closes an already opened ``(``; and the index after it."""
    depth, j, n = 1, start, len(s)
    while j < n:
        ch = s[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "'":
            k = s.find("'", j + 1)
            if k < 0:
                raise ParseError("unterminated single quote")
            j = k + 1
            continue
        if ch == '"':
            j = _skip_double(s, j + 1)
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return s[start:j], j + 1
        j += 1
    raise ParseError("unbalanced parentheses")


def _skip_double(s: str, j: int) -> int:
    """Index after the double quote that closes one opened before ``j`` (nested $( … ) skipped whole)."""
    n = len(s)
    while j < n:
        ch = s[j]
        if ch == "\\":
            j += 2
            continue
        if ch == '"':
            return j + 1
        if s.startswith("$(", j):
            _inner, j = capture_paren(s, j + 2)
            continue
        j += 1
    raise ParseError("unterminated double quote")


def _skip_ansi(s: str, j: int) -> int:
    """Index after the quote closing a $'…' string whose body starts at ``j`` (backslash escapes anything)."""
    n = len(s)
    while j < n:
        if s[j] == "\\":
            j += 2
            continue
        if s[j] == "'":
            return j + 1
        j += 1
    raise ParseError("unterminated $'…' quote")



class Lexer:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.tokens: list[Token] = []
        self.subs: list[str] = []
        self.word: Word | None = None

    # -------------------------------------------------------- helpers

    def _w(self) -> Word:
        if self.word is None:
            self.word = Word()
        return self.word

    def _end(self) -> None:
        if self.word is not None:
            self.tokens.append(self.word)
            self.word = None

    def _sub(self, inner: str) -> None:
        w = self._w()
        w.subs.append(len(self.subs))
        self.subs.append(inner)
        w.add(SUB, "x")
        w.unknown = True

    def _backtick(self, j: int) -> int:
        """Capture `…` whose body starts at ``j``; return the index after the closing backtick."""
        s, n, buf = self.s, len(self.s), []
        while j < n and s[j] != "`":
            if s[j] == "\\" and j + 1 < n:
                buf.append(s[j + 1])
                j += 2
            else:
                buf.append(s[j])
                j += 1
        if j >= n:
            raise ParseError("unterminated backtick")
        self._sub("".join(buf))
        return j + 1

    def _dollar(self, j: int) -> int | None:
        """Handle a ``$`` at ``j`` (in or out of double quotes); None when it is a plain character."""
        s = self.s
        nxt = s[j + 1] if j + 1 < len(s) else ""
        w = self._w()
        if nxt == "(":
            inner, end = capture_paren(s, j + 2)
            self._sub(inner)
            return end
        if nxt == "{":
            m = _SIMPLE_BRACED.match(s, j + 1)
            if m:
                w.vars.add(m.group(1))
                w.add("${" + m.group(1) + "}", "x")
                return m.end()
            w.unknown = True  # ${x:-…}: the contents are lexed as they come
            w.add("$", "x")
            w.add("{", "o")
            return j + 2
        if nxt == "[":  # $[…]: the old arithmetic expansion
            w.unknown = True
            w.add("$", "x")
            return j + 1
        m = _NAME.match(s, j + 1)
        if m:
            w.vars.add(m.group(0))
            w.add("$" + m.group(0), "x")
            return m.end()
        if nxt and nxt in _SPECIAL:
            w.vars.add(nxt)
            w.add("$" + nxt, "x")
            return j + 2
        return None

    def _double(self) -> None:
        s, n = self.s, len(self.s)
        w = self._w()
        w.quoted = True
        j = self.i + 1
        if s[j : j + 1] == '"':
            w.empties.append(len(w.text))
        while True:
            if j >= n:
                raise ParseError("unterminated double quote")
            ch = s[j]
            if ch == '"':
                self.i = j + 1
                return
            if ch == "\\" and j + 1 < n and s[j + 1] in '"\\$`\n':
                if s[j + 1] != "\n":
                    w.add(s[j + 1], "e")
                j += 2
                continue
            if ch == "`":
                j = self._backtick(j + 1)
                continue
            if ch == "$":
                end = self._dollar(j)
                if end is not None:
                    j = end
                    continue
            w.add(ch, "q")
            j += 1

    def _op(self) -> None:
        s, c = self.s, self.s[self.i]
        fd = ""
        if self.word is not None and c in "<>" and self.word.text.isdigit() and self.word.mask == "u" * len(
                self.word.text):
            fd = self.word.text
            self.word = None
        self._end()
        for op in OPS:
            if s.startswith(op, self.i):
                self.tokens.append(Op(fd + op))
                self.i += len(op)
                return
        raise ParseError(f"unexpected {c!r}")  # not reached: every operator character starts an op

    # -------------------------------------------------------- the scan

    def run(self) -> tuple[list[Token], list[str]]:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in " \t\r":
                self._end()
                self.i += 1
            elif c == "\n":
                self._end()
                self.tokens.append(Op(";"))
                self.i += 1
            elif c == "#" and self.word is None:
                j = s.find("\n", self.i)
                self.i = n if j < 0 else j
            elif c == "\\":
                if self.i + 1 < n and s[self.i + 1] == "\n":
                    self.i += 2
                    continue
                self._w().add(s[self.i + 1] if self.i + 1 < n else "\\", "e")
                self.i += 2
            elif c == "'":
                j = s.find("'", self.i + 1)
                if j < 0:
                    raise ParseError("unterminated single quote")
                w = self._w()
                w.quoted = True
                if j == self.i + 1:
                    w.empties.append(len(w.text))
                w.add(s[self.i + 1 : j], "q")
                self.i = j + 1
            elif c == '"':
                self._double()
            elif c == "$" and s.startswith("$'", self.i):
                end = _skip_ansi(s, self.i + 2)
                w = self._w()
                w.quoted = w.unknown = w.ansi = True  # escapes like \x2e are not decoded here
                w.add(s[self.i + 2 : end - 1], "q")
                self.i = end
            elif c == "$" and s.startswith('$"', self.i):
                self.i += 1  # a locale-translated string is a double-quoted one
            elif c == "$":
                end = self._dollar(self.i)
                if end is None:
                    self._w().add("$", "u")
                    self.i += 1
                else:
                    self.i = end
            elif c == "`":
                self.i = self._backtick(self.i + 1)
            elif c in "<>" and s.startswith("(", self.i + 1):
                inner, end = capture_paren(s, self.i + 2)
                self._end()
                self._sub(inner)
                self._end()
                self.i = end
            elif c in _OP_CHARS:
                self._op()
            else:
                self._w().add(c, "u")
                self.i += 1
        self._end()
        return self.tokens, self.subs


def lex(command: str) -> tuple[list[Token], list[str]]:
    """(tokens, substitution bodies) of a command line; ParseError when it cannot be read."""
    return Lexer(command).run()


# ---------------------------------------------------------------- simple commands


@dataclass
class Segment:
    words: list[Word] = field(default_factory=list)
    redirects: list[tuple[str, Word | None]] = field(default_factory=list)
    pipeline: int = 0


_SEPARATORS = {";", "&&", "||", "&", ";;", ";&", ";;&", "(", ")"}
_PIPES = {"|", "|&"}


def segments(tokens: list[Token]) -> tuple[list[Segment], bool]:
    """The simple commands of a token list (with their redirections and pipeline number); and whether it
    used subshells or case."""
    found = [Segment()]
    structured = False
    pipeline = 0
    pending: str | None = None
    for tok in tokens:
        if isinstance(tok, Op):
            base = tok.text.lstrip("0123456789")
            if pending is not None:  # an operator where a redirection's target should be
                found[-1].redirects.append((pending, None))
                pending = None
            if base in _PIPES:
                found.append(Segment(pipeline=pipeline))
            elif base in _SEPARATORS:
                if base in ("(", ")", ";;", ";&", ";;&"):
                    structured = True
                pipeline += 1
                found.append(Segment(pipeline=pipeline))
            else:
                pending = tok.text
        elif pending is not None:
            found[-1].redirects.append((pending, tok))
            pending = None
        else:
            found[-1].words.append(tok)
    if pending is not None:
        found[-1].redirects.append((pending, None))
    return [s for s in found if s.words or s.redirects], structured


# ---------------------------------------------------------------- brace expansion, as bash's braces.c does it

_Piece = tuple[str, str]  # (text, mask)
_EMPTY = "\udfff"  # where an empty '' or "" stood while braces are expanded (a lone surrogate: never in a command)
_INTMAX = 2**63 - 1


def expand_braces(word: Word, limit: int = MAX_BRACE) -> list[Word]:
    """The words bash's brace expansion makes of ``word`` (itself alone when there is none); TooMany past
    ``limit``. Comma lists and {x..y[..step]} sequences, nested; quoted and expanded parts are left alone."""
    if "{" not in word.text:
        return [word]
    text, mask = word.text, word.mask
    for at in sorted(word.empties, reverse=True):  # an empty '' is text to bash's brace expansion: keep its place
        text, mask = text[:at] + _EMPTY + text[at:], mask[:at] + "q" + mask[at:]
    pieces = _expand(text, mask, [limit])
    if pieces == [(text, mask)]:
        return [word]
    out = []
    for t, m in pieces:
        if not t:
            continue  # bash drops the empty words {,} makes (not a quoted empty one: {,}'')
        empties = [i - k for k, i in enumerate(i for i, c in enumerate(t) if c == _EMPTY)]
        keep = [i for i, c in enumerate(t) if c != _EMPTY]
        t, m = "".join(t[i] for i in keep), "".join(m[i] for i in keep)
        out.append(Word(text=t, mask=m, quoted=bool(set(m) & {"q", "e"}) or bool(empties), unknown=word.unknown,
                        ansi=word.ansi, vars=set(word.vars), subs=list(word.subs), empties=empties))
    return out


def _gobble(t: str, m: str, i: int, satisfy: str) -> int:
    """Where bash's brace_gobbler stops looking for ``satisfy`` from ``i`` (-1: not found)."""
    level, commas, n = 0, 0 if satisfy == "}" else 1, len(t)
    while i < n:
        c, k = t[i], m[i]
        if k == "o":  # the { of a ${…}: its closing } is an unquoted one
            level += 1
        elif k == "u":
            if c == satisfy and level == 0 and commas > 0:
                # a { alone, or {} at the start of a word, opens nothing
                if not (c == "{" and i == 0 and (n == 1 or (t[1] == "}" and m[1] == "u"))):
                    return i
            elif c == "{":
                level += 1
            elif c == "}" and level:
                level -= 1
            elif satisfy == "}" and level == 0 and (
                    c == "," or (t.startswith("..", i) and m[i + 1] == "u" and t[i + 2 : i + 3] != "}")):
                commas += 1
        i += 1
    return -1


def _expand(t: str, m: str, budget: list[int]) -> list[_Piece]:
    i = 0
    while True:  # the first { that starts a valid brace expression
        i = _gobble(t, m, i, "{")
        if i < 0:
            return [(t, m)]
        j = _gobble(t, m, i + 1, "}")
        if j >= 0:
            break
        i += 1
    at, am = t[i + 1 : j], m[i + 1 : j]
    tack: list[_Piece]
    if not _has_comma(at, am):
        seq = _sequence(at, budget) if am == "u" * len(am) else None
        if seq is not None:
            tack = [(s, "u" * len(s)) for s in seq]
        elif j + 1 < len(t):
            tack = [(t[i : j + 1], m[i : j + 1])]  # not a sequence: the braces stay, the rest is expanded
        else:
            return [(t, m)]
    else:
        tack = []
        start = k = 0
        while True:
            k = _gobble(at, am, start, ",")
            end = len(at) if k < 0 else k
            tack += _expand(at[start:end], am[start:end], budget)
            if k < 0:
                break
            start = k + 1
    result = _concat([(t[:i], m[:i])], tack, budget)
    if j + 1 < len(t):
        result = _concat(result, _expand(t[j + 1 :], m[j + 1 :], budget), budget)
    return result


def _has_comma(t: str, m: str) -> bool:
    """bash looks for a comma in the brace's text as written, quotes and all, skipping backslash escapes."""
    i = 0
    while i < len(t):
        if m[i] == "e" or (t[i] == "\\" and m[i] == "q"):
            i += 1 if m[i] == "e" else 2
            continue
        if t[i] == "," and m[i] in "uq":
            return True
        i += 1
    return False


def _concat(left: list[_Piece], right: list[_Piece], budget: list[int]) -> list[_Piece]:
    if left == [("", "")]:
        return right
    if right == [("", "")]:
        return left
    if len(left) * len(right) > budget[0]:
        raise TooMany()
    return [(a + b, am + bm) for a, am in left for b, bm in right]


_NUMBER = re.compile(r"[+-]?\d+")


def _sequence(text: str, budget: list[int]) -> list[str] | None:
    """bash's expand_seqterm: {1..5} {05..1..2} {a..e} {z..a..2}; None when ``text`` is not one."""
    k = text.find("..")
    if k <= 0 or k + 2 >= len(text):
        return None
    lhs, rhs = text[:k], text[k + 2 :]
    ascii_letter = re.compile(r"[A-Za-z]")
    lhs_t = "int" if _NUMBER.fullmatch(lhs) else "char" if len(lhs) == 1 and ascii_letter.fullmatch(lhs) else ""
    number = _NUMBER.match(rhs)
    if number and (rhs[0].isdigit() or rhs[1:2].isdigit()):
        rhs_t, end = "int", number.end()
    elif ascii_letter.fullmatch(rhs[0]) and rhs[1:2] in ("", "."):
        rhs_t, end = "char", 1
    else:
        return None
    incr, rest = 1, rhs[end:]
    if rest.startswith("..") and len(rest) > 2:
        step = _NUMBER.match(rest, 2)
        if not step or step.end() != len(rest):
            return None
        incr = int(step.group(0))
    elif rest:
        return None
    if lhs_t != rhs_t:
        return None
    if lhs_t == "char":
        start, stop, width = ord(lhs), ord(rhs[0]), 0
    else:
        start, stop = int(lhs), int(rhs[:end])
        if max(abs(start), abs(stop), abs(incr)) > _INTMAX:
            return None
        width = 0
        for side in (lhs, rhs[:end]):
            if (len(side) > 1 and side[0] == "0") or (len(side) > 2 and side[:2] == "-0"):
                width = max(width, len(lhs), len(rhs[:end]))
    incr = abs(incr) or 1
    if start > stop:
        incr = -incr
    if abs(stop - start) // abs(incr) + 1 > budget[0]:
        raise TooMany()
    values = range(start, stop + (1 if incr > 0 else -1), incr)
    if lhs_t == "char":
        return [chr(v) for v in values]
    return [f"{v:0{width}d}" if width else str(v) for v in values]
