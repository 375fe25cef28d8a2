"""Every query lives in a store module: SQL in any other Python file fails this test (DESIGN.md "SQLite")."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("common", "services", "schema", "bench", "tests")
THIS_FILE = Path(__file__).resolve()

# SQL as this codebase writes it: keywords in upper case, in a recognisable statement shape.
# Prose ("Select the next turn", "acks after commit") is not upper case and does not match.
_SQL_SHAPES = [
    re.compile(r"\bSELECT\b[\s\S]*?\bFROM\b"),
    re.compile(r"^\s*SELECT\s+\S"),
    re.compile(r"\bINSERT\s+(?:OR\s+[A-Z]+\s+)?INTO\b"),
    re.compile(r"\bREPLACE\s+INTO\b"),
    re.compile(r"\bUPDATE\s+(?:OR\s+[A-Z]+\s+)?[\w\"]+\s+SET\b"),
    re.compile(r"\bDELETE\s+FROM\b"),
    re.compile(
        r"\b(?:CREATE|DROP)\s+(?:TEMP\s+|TEMPORARY\s+|UNIQUE\s+|VIRTUAL\s+)?(?:TABLE|INDEX|TRIGGER|VIEW)\b"
    ),
    re.compile(r"\bALTER\s+TABLE\b"),
    re.compile(r"\bPRAGMA\s+[a-z_]+"),
    re.compile(r"\bVACUUM\s+INTO\b"),
    # transaction control is short: it counts only as a whole string
    re.compile(
        r"^\s*(?:BEGIN(?:\s+(?:DEFERRED|IMMEDIATE|EXCLUSIVE))?(?:\s+TRANSACTION)?"
        r"|COMMIT(?:\s+TRANSACTION)?|ROLLBACK(?:\s+TRANSACTION)?(?:\s+TO\s+(?:SAVEPOINT\s+)?\w+)?"
        r"|SAVEPOINT\s+\w+|RELEASE\s+(?:SAVEPOINT\s+)?\w+|VACUUM|ANALYZE)\s*;?\s*$"
    ),
]

_PREFIX = re.compile(r"^[rRbBuUfF]*")
_FSTRING_START = getattr(tokenize, "FSTRING_START", None)  # Python 3.12+ splits f-strings
_FSTRING_MIDDLE = getattr(tokenize, "FSTRING_MIDDLE", None)
_FSTRING_END = getattr(tokenize, "FSTRING_END", None)
_BETWEEN_PARTS = {tokenize.NL, tokenize.COMMENT}  # what may sit between two joined literals
_STATEMENT_START = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
_STATEMENT_END = {tokenize.NEWLINE, tokenize.ENDMARKER}


def _body(token_text: str) -> str:
    """The text between a string literal's quotes (escapes left as written)."""
    text = _PREFIX.sub("", token_text)
    for quote in ('"""', "'''", '"', "'"):
        if text.startswith(quote) and text.endswith(quote) and len(text) >= 2 * len(quote):
            return text[len(quote) : -len(quote)]
    return text


def _strings(source: str) -> list[tuple[int, str]]:
    """(first line, text) of every string literal, adjacent literals joined as Python joins them.

    A string that is a statement of its own (a docstring) is left out: it cannot run as SQL.
    """
    found: list[tuple[int, str]] = []
    parts: list[str] = []
    line = 0
    depth = 0  # inside a 3.12 f-string: only its literal parts count
    before = tokenize.NEWLINE  # the kind of token that came before the current string
    last = tokenize.NEWLINE  # the kind of the last token that was not a string part or a blank

    def flush(after: int) -> None:
        nonlocal parts
        if parts and not (before in _STATEMENT_START and after in _STATEMENT_END):
            found.append((line, "".join(parts)))
        parts = []

    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if _FSTRING_START is not None and tok.type == _FSTRING_START:
            if not parts and depth == 0:
                line, before = tok.start[0], last
            depth += 1
        elif _FSTRING_END is not None and tok.type == _FSTRING_END:
            depth -= 1
        elif _FSTRING_MIDDLE is not None and tok.type == _FSTRING_MIDDLE:
            parts.append(tok.string)
        elif depth:
            continue
        elif tok.type == tokenize.STRING:
            if not parts:
                line, before = tok.start[0], last
            parts.append(_body(tok.string))
        elif tok.type not in _BETWEEN_PARTS:
            flush(tok.type)
            last = tok.type
    flush(tokenize.ENDMARKER)
    return found


def sql_offences(path: Path) -> list[str]:
    """``file:line`` of each string literal in ``path`` that looks like SQL."""
    offences = []
    for line, text in _strings(path.read_text(encoding="utf-8")):
        if any(shape.search(text) for shape in _SQL_SHAPES):
            snippet = " ".join(text.split())[:60]
            offences.append(f"{path}:{line}: {snippet}")
    return offences


def scanned_files(root: Path = REPO) -> list[Path]:
    files = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            if path.name.endswith("_store.py") or path.resolve() == THIS_FILE:
                continue
            files.append(path)
    return files


def test_no_sql_outside_store_modules():
    offences = [offence for path in scanned_files() for offence in sql_offences(path)]
    assert [] == offences


def test_the_scan_covers_the_code_and_the_tests():
    names = {path.relative_to(REPO).as_posix() for path in scanned_files()}
    assert {"common/db.py", "tests/test_stores.py", "tests/test_migrations.py"} <= names


def test_the_scan_skips_store_modules():
    assert [] == [path for path in scanned_files() if path.name.endswith("_store.py")]


def test_the_checker_catches_planted_sql(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""A module that cheats."""\n'
        "\n"
        "def pending(conn):\n"
        '    return conn.execute("SELECT id FROM turns WHERE state = ?", ("pending",))\n'
        "\n"
        "QUERY = (\n"
        '    "UPDATE outbox"\n'
        "    \" SET state = 'sent'\"\n"
        ")\n"
        'conn.execute(f"DELETE FROM {table} WHERE id = ?")\n'
        "conn.execute('COMMIT')\n"
        'conn.execute("PRAGMA user_version")\n'
        'STATEMENTS = ["BEGIN IMMEDIATE", "ROLLBACK"]\n'
    )
    expected = [4, 7, 10, 11, 12, 13, 13]
    assert expected == [int(offence.split(":")[1]) for offence in sql_offences(planted)]


def test_the_checker_ignores_prose(tmp_path):
    prose = tmp_path / "prose.py"
    prose.write_text(
        '"""Select the next turn from the queue; the writer acks after commit.\n'
        "\n"
        "Delete from the outbox what was sent, update the session and insert into history.\n"
        "Begin, commit, rollback: the writer owns transactions. See PRAGMAS in db_store.\n"
        '"""\n'
        "\n"
        "def check(conn):\n"
        '    """Runs PRAGMA integrity_check, i.e. SELECT-like reads FROM the db_store."""\n'
        "    return db_store.integrity_check(conn)\n"
        "\n"
        "# SELECT * FROM turns -- a comment is not a string\n"
        'LEVELS = ("DEBUG", "INFO", "COMMITTED", "BEGINNING")\n'
        'MESSAGE = "UPDATE: the session was closed"\n'
        'HINT = "run `starling fts rebuild` to select from scratch"\n'
    )
    assert [] == sql_offences(prose)
