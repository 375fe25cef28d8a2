"""Chat commands a person sends to their agent: /new, /status, /help, /approve, /deny."""

from __future__ import annotations

from typing import Awaitable, Callable

from common.db import read_tx
from common.errors import WriteRejected
from common.stores import approval_store, audit_store, session_store, turn_store
from schema import messages as m

HELP = """\
Commands:
/new — start a fresh conversation (memories in MEMORY.md and USER.md stay)
/status — this agent, its model, this conversation's size and cost, pending approvals
/approve ID — allow the action an approval asked for (/approve ID always: also from now on)
/deny ID — refuse it
/help — this list"""

COMMANDS = ("/new", "/status", "/help", "/approve", "/deny")


def parse(text: str) -> tuple[str, list[str]] | None:
    """("/approve", ["AB12CD34"]) for a command, None for anything else (text that merely starts with /)."""
    words = text.strip().split()
    if not words:
        return None
    name = words[0].split("@", 1)[0].lower()  # Telegram appends @botname in groups
    return (name, words[1:]) if name in COMMANDS else None


async def run(name: str, args: list[str], claim: m.TurnClaim, call: Callable[[m.WriteOp], Awaitable],
              reader, describe_model: str) -> str:
    """The command's reply text; state changes go through the writer like everything else."""
    if name == "/help":
        return HELP
    if name == "/new":
        await call(m.CloseSession(session_id=claim.session_id, reason="new"))
        return "Started a new conversation. I still keep what is in MEMORY.md and USER.md."
    if name == "/status":
        return _status(claim, reader, describe_model)
    if not args:
        return f"Usage: {name} ID" + (" [always]" if name == "/approve" else "")
    return await _decide(name == "/approve", args, claim, call, reader)


def _status(claim: m.TurnClaim, reader, describe_model: str) -> str:
    with read_tx(reader) as conn:
        turns = turn_store.count_in_session(conn, claim.session_id)
        tokens_in, tokens_out, cost = audit_store.usage_for_session(conn, claim.session_id)
        waiting = [a for a in approval_store.pending(conn) if a.session_id == claim.session_id]
    lines = [
        f"Agent: {claim.agent} · model: {describe_model}",
        f"Conversation {claim.session_id}: {turns} turns, {tokens_in + tokens_out} tokens, ${cost:.4f}",
        f"Pending approvals: {', '.join(a.id for a in waiting) if waiting else 'none'}",
    ]
    return "\n".join(lines)


async def _decide(approve: bool, args: list[str], claim: m.TurnClaim, call, reader) -> str:
    approval_id = args[0].strip().upper()
    always = approve and len(args) > 1 and args[1].lower() == "always"
    with read_tx(reader) as conn:
        approval = approval_store.get(conn, approval_id)
        session = session_store.get(conn, approval.session_id) if approval and approval.session_id else None
    # an approval is decided only from the chat it was asked in
    if approval is None or session is None or (session.instance, session.chat) != (claim.instance, claim.chat):
        return f"There is no approval {approval_id} in this chat."
    try:
        await call(m.DecideApproval(approval_id=approval_id, approve=approve, decided_by=claim.sender, always=always,
                                    grant_pattern=approval.arguments if always else ""))
    except WriteRejected as exc:
        return f"Approval {approval_id} could not be decided: {str(exc).split(': ', 1)[-1]}."
    if not approve:
        return f"Denied {approval_id}."
    return f"Approved {approval_id}" + (" (and from now on)." if always else ".")
