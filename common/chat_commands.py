"""The chat commands a person sends to their agent, defined once: their names and what they do, how a
message is read as one, and the texts that name them (the help, Telegram's command menu, an approval's
notice, a button's command). The runner answers them (services/runner/commands.py), the gateways offer
and forward them, the sweeper leaves them out of a conversation's capture, `starling chat` follows them."""

from __future__ import annotations

from typing import NamedTuple

NEW = "/new"
STATUS = "/status"
HELP = "/help"
APPROVE = "/approve"
DENY = "/deny"
ALWAYS = "always"  # "/approve ID always": also from now on
START = "/start"   # Telegram's first contact: the gateway greets; it never reaches the runner


class Command(NamedTuple):
    name: str
    usage: str    # as the help shows it
    does: str     # the help's line
    menu: str     # the short line of a platform's command menu (Telegram's setMyCommands)


COMMANDS = (
    Command(NEW, NEW, "start a fresh conversation (memories in MEMORY.md and USER.md stay)",
            "start a fresh conversation"),
    Command(STATUS, STATUS, "this agent, its model, this conversation's size and cost, pending approvals",
            "agent, model, conversation size and cost"),
    Command(APPROVE, f"{APPROVE} ID", f"allow the action an approval asked for ({APPROVE} ID {ALWAYS}: also from now on)",
            f"approve an action: {APPROVE} ID"),
    Command(DENY, f"{DENY} ID", "refuse it", f"refuse an action: {DENY} ID"),
    Command(HELP, HELP, "this list", "what I understand"),
)
NAMES = tuple(c.name for c in COMMANDS)
DECISIONS = (APPROVE, DENY)

HELP_TEXT = "Commands:\n" + "\n".join(f"{c.usage} — {c.does}" for c in COMMANDS)


def parse(text: str) -> tuple[str, list[str]] | None:
    """("/approve", ["AB12CD34"]) for a command, None for anything else (text that merely starts with /)."""
    words = text.strip().split()
    if not words:
        return None
    name = words[0].split("@", 1)[0].lower()  # Telegram appends @botname in groups
    return (name, words[1:]) if name in NAMES else None


def is_command(text: str) -> bool:
    return parse(text) is not None


def decision(text: str) -> tuple[bool, str, bool] | None:
    """(approve, approval id, always) of an /approve or /deny that names an approval; None otherwise."""
    parsed = parse(text)
    if parsed is None or parsed[0] not in DECISIONS or not parsed[1]:
        return None
    name, args = parsed
    approve = name == APPROVE
    return approve, args[0].strip().upper(), approve and len(args) > 1 and args[1].lower() == ALWAYS


def decide_text(approve: bool, approval_id: str) -> str:
    """What a button stands for, as if the person had written it: "/approve AB12CD34"."""
    return f"{APPROVE if approve else DENY} {approval_id}"


def approval_hint(approval_id: str) -> str:
    """The last line of an approval's notice, for platforms without buttons (and as the buttons' fallback)."""
    return (f"Approve with {APPROVE} {approval_id} (or {APPROVE} {approval_id} {ALWAYS}), or {DENY} {approval_id}.")


def menu() -> list[dict[str, str]]:
    """The commands as Telegram's setMyCommands takes them (names without the slash)."""
    return [{"command": c.name.lstrip("/"), "description": c.menu} for c in COMMANDS]
