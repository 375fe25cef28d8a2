"""The chat-command vocabulary (common/chat_commands.py): read once, named the same in the help, the menu and
an approval's notice."""

from __future__ import annotations

from common import chat_commands as cc


def test_a_command_is_read_with_its_arguments_and_a_bot_name_dropped():
    assert ("/approve", ["ab12cd34", "always"]) == cc.parse("  /Approve@starling_bot ab12cd34 always ")
    assert ("/new", []) == cc.parse("/new")
    assert [None, None, None] == [cc.parse(t) for t in ("", "/etc/passwd is a file", "hello /new")]


def test_a_decision_names_its_approval_in_upper_case():
    assert (True, "AB12CD34", True) == cc.decision("/approve ab12cd34 ALWAYS")
    assert (False, "AB12CD34", False) == cc.decision("/deny ab12cd34 always")  # always only widens an approval
    assert [None, None] == [cc.decision("/approve"), cc.decision("/status AB12CD34")]


def test_a_button_and_a_notice_say_what_a_person_would_type():
    assert (True, "XY34ZW56", False) == cc.decision(cc.decide_text(True, "XY34ZW56"))
    assert (False, "XY34ZW56", False) == cc.decision(cc.decide_text(False, "XY34ZW56"))
    assert "/approve XY34ZW56 always" in cc.approval_hint("XY34ZW56") and "/deny XY34ZW56" in cc.approval_hint("XY34ZW56")


def test_the_help_and_the_menu_list_every_command():
    assert list(cc.NAMES) == [line.split()[0] for line in cc.HELP_TEXT.splitlines()[1:]]
    assert [n.lstrip("/") for n in cc.NAMES] == [c["command"] for c in cc.menu()]
