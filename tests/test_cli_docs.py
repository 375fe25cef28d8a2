"""Every CLI verb has help text and is named in the README (sqlite-utils' test_docs idea)."""

from __future__ import annotations

import argparse
from pathlib import Path

from common.cli.main import build_parser

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def verbs() -> list[tuple[str, str | None]]:
    found = []

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in action._choices_actions}
                for name, sub in action.choices.items():
                    found.append((f"{prefix}{name}", helps.get(name)))
                    walk(sub, f"{prefix}{name} ")

    walk(build_parser(), "")
    return found


def test_every_verb_has_help_text():
    assert [] == [name for name, text in verbs() if not text]


def test_every_verb_is_in_the_readme():
    assert [] == [name for name, _ in verbs() if f"starling {name}" not in README]
