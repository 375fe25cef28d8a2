"""A service's command line, read without argparse when it is the plain ``--option VALUE`` form supervisord and
systemd give; anything else (``--help``, an error, an abbreviation, ``--``) goes to argparse, which answers as
it always did.

Why: argparse and the gettext it brings cost every service ~0.9 MB of RSS (the import, and the parser built
with its translated messages), for a command line of two or three options read once at start.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable


class Options:
    """Takes ``add_argument`` calls as an argparse parser would (the part of its API services use: long
    options, ``action`` store or append, ``default``, ``help``, ``metavar``) and keeps them, for the plain
    reading below and for the argparse parser built when that reading cannot answer."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, ...], dict[str, Any]]] = []

    def add_argument(self, *flags: str, **kw: Any) -> None:
        self.calls.append((flags, kw))


def parse(argv: list[str], prog: str, description: str, options: Options) -> Any:
    """The parsed command line: a namespace with one attribute per option, as argparse's parse_args gives."""
    plain = _plain(argv, options)
    if plain is not None:
        return plain
    import argparse

    parser = argparse.ArgumentParser(prog=prog, description=description)
    for flags, kw in options.calls:
        parser.add_argument(*flags, **kw)
    return parser.parse_args(argv)


def _dest(flags: tuple[str, ...], kw: dict[str, Any]) -> str:
    return kw.get("dest") or flags[0].lstrip("-").replace("-", "_")


def _plain(argv: list[str], options: Options) -> SimpleNamespace | None:
    """``--opt VALUE`` and ``--opt=VALUE`` of known long options, each to store or append; None for anything
    else, so argparse decides (and prints its usage or error) exactly as before."""
    known: dict[str, tuple[str, bool]] = {}  # flag -> (dest, appends)
    values: dict[str, Any] = {}
    for flags, kw in options.calls:
        action = kw.get("action", "store")
        if action not in ("store", "append") or set(kw) - {"action", "default", "help", "metavar", "dest"}:
            return None
        if any(not flag.startswith("--") for flag in flags):
            return None
        dest = _dest(flags, kw)
        default = kw.get("default")
        values[dest] = list(default) if action == "append" and default is not None else default
        for flag in flags:
            known[flag] = (dest, action == "append")
    i = 0
    while i < len(argv):
        token = argv[i]
        flag, eq, value = token.partition("=")
        if flag not in known:
            return None  # a positional, -h, an abbreviation, "--", an unknown option: argparse's to answer
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                return None
            value = argv[i + 1]
            i += 1
        dest, appends = known[flag]
        if appends:
            values[dest] = [*(values[dest] or []), value]
        else:
            values[dest] = value
        i += 1
    return SimpleNamespace(**values)


AddArguments = Callable[[Options], None]
