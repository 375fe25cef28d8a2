"""The runner's answers to the chat commands (common/chat_commands.py defines them and reads a message as one):
/new, /status, /help, /approve, /deny."""

from __future__ import annotations

from typing import Awaitable, Callable

from common import chat_commands as cc
from common.db import read_tx
from common.errors import WriteRejected
from common.stores import approval_store, audit_store, session_store, turn_store
from schema import messages as m


async def run(name: str, args: list[str], claim: m.TurnClaim, call: Callable[[m.WriteOp], Awaitable],
              reader, describe_model: str) -> str:
    """The command's reply text; state changes go through the writer like everything else."""
    if name == cc.HELP:
        return cc.HELP_TEXT
    if name == cc.NEW:
        await call(m.CloseSession(session_id=claim.session_id, reason="new"))
        return "Started a new conversation. I still keep what is in MEMORY.md and USER.md."
    if name == cc.STATUS:
        return _status(claim, reader, describe_model)
    decided = cc.decision(" ".join([name, *args]))
    if decided is None:
        return f"Usage: {name} ID" + (f" [{cc.ALWAYS}]" if name == cc.APPROVE else "")
    return await _decide(*decided, claim, call, reader)


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


async def _decide(approve: bool, approval_id: str, always: bool, claim: m.TurnClaim, call, reader) -> str:
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
