"""A conservative lexer for shell command lines: words, operators and the command substitutions inside.

It exists for the approval classes (classify.py), not to run anything: where it cannot follow bash it
errs toward seeing *more* code (an unquoted region bash would treat as text), never less, and it
raises ParseError on what it cannot read (unterminated quotes, unbalanced parentheses). Covered:
'single', "double" (with $(…), `…` and $var inside), $'ANSI-C', \\ escapes and line continuations,
comments, $(…), `…`, <(…) >(…), ${…} (its contents are lexed like the rest), fd-prefixed
redirections (2>, 2>&1), heredoc operators (their bodies are lexed as commands: bash expands them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SUB = "\x00"  # stands for a substitution's output inside a word (a command cannot contain NUL)
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


@dataclass
class Word:
    text: str = ""
    quoted: bool = False  # some part was quoted or escaped
    unknown: bool = False  # a part bash computes that we cannot: substitution, $'…', ${…} with operators
    glob: bool = False  # an unquoted * ? [
    brace: bool = False  # an unquoted { (brace expansion)
    tilde: bool = False  # starts with an unquoted ~
    vars: set[str] = field(default_factory=set)  # simple $NAME / ${NAME} references
    subs: list[int] = field(default_factory=list)  # indexes into the lexer's substitutions


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
        w.text += SUB
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
                w.text += "${" + m.group(1) + "}"
                return m.end()
            w.unknown = True  # ${x:-…}: the contents are lexed as they come
            w.text += "${"
            return j + 2
        m = _NAME.match(s, j + 1)
        if m:
            w.vars.add(m.group(0))
            w.text += "$" + m.group(0)
            return m.end()
        if nxt and nxt in _SPECIAL:
            w.vars.add(nxt)
            w.text += "$" + nxt
            return j + 2
        return None

    def _double(self) -> None:
        s, n = self.s, len(self.s)
        w = self._w()
        w.quoted = True
        j = self.i + 1
        while True:
            if j >= n:
                raise ParseError("unterminated double quote")
            ch = s[j]
            if ch == '"':
                self.i = j + 1
                return
            if ch == "\\" and j + 1 < n and s[j + 1] in '"\\$`\n':
                if s[j + 1] != "\n":
                    w.text += s[j + 1]
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
            w.text += ch
            j += 1

    def _op(self) -> None:
        s, c = self.s, self.s[self.i]
        fd = ""
        if self.word is not None and c in "<>" and self.word.text.isdigit() and not self.word.quoted:
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
                w = self._w()
                w.quoted = True
                w.text += s[self.i + 1] if self.i + 1 < n else "\\"
                self.i += 2
            elif c == "'":
                j = s.find("'", self.i + 1)
                if j < 0:
                    raise ParseError("unterminated single quote")
                w = self._w()
                w.quoted = True
                w.text += s[self.i + 1 : j]
                self.i = j + 1
            elif c == '"':
                self._double()
            elif c == "$" and s.startswith("$'", self.i):
                end = _skip_ansi(s, self.i + 2)
                w = self._w()
                w.quoted = w.unknown = True  # escapes like \x2e are not decoded here
                w.text += s[self.i + 2 : end - 1]
                self.i = end
            elif c == "$" and s.startswith('$"', self.i):
                self.i += 1  # a locale-translated string is a double-quoted one
            elif c == "$":
                end = self._dollar(self.i)
                if end is None:
                    self._w().text += "$"
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
                w = self._w()
                if c in "*?[":
                    w.glob = True
                elif c == "{":
                    w.brace = True
                elif c == "~" and not w.text and not w.quoted:
                    w.tilde = True
                w.text += c
                self.i += 1
        self._end()
        return self.tokens, self.subs


def lex(command: str) -> tuple[list[Token], list[str]]:
    """(tokens, substitution bodies) of a command line; ParseError when it cannot be read."""
    return Lexer(command).run()


def expand_braces(text: str, limit: int = 64) -> list[str]:
    """Bash brace expansion of comma lists ({a,b}c → ac bc), nested, at most ``limit`` results."""
    depth, start = 0, -1
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                body, parts, level, last = text[start + 1 : i], [], 0, 0
                for k, b in enumerate(body):
                    if b == "{":
                        level += 1
                    elif b == "}":
                        level -= 1
                    elif b == "," and level == 0:
                        parts.append(body[last:k])
                        last = k + 1
                if not parts:
                    continue  # {x} or {1..3}: no comma list here, look further on
                parts.append(body[last:])
                out: list[str] = []
                for alt in parts:
                    for rest in expand_braces(alt + text[i + 1 :], limit):
                        out.append(text[:start] + rest)
                        if len(out) >= limit:
                            return out
                return out
    return [text]
