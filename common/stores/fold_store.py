"""Bursts folded into one turn ([conversation] queue = "collect"): a session's later pending messages join its running turn."""

from __future__ import annotations

import apsw

HELD = "SELECT session_id FROM turns WHERE id = ? AND state = 'claimed' AND lease_owner = ?"
LATER_PENDING = (
    "SELECT id, content, attachments FROM turns WHERE session_id = ? AND id > ? AND role = 'user'"
    " AND state IN ('pending', 'claimed') AND state = 'pending' ORDER BY id"
)
# A folded message is answered by the turn it joined: done at once, under that turn (parent_id), so
# whoever runs that turn (again, after a runner died) reads it in the conversation: nothing is lost.
FOLD = (
    "UPDATE turns SET state = 'done', parent_id = ?, done_at = ?,"
    " meta = json_set(CASE WHEN json_valid(meta) THEN meta ELSE '{}' END, '$.folded_into', ?)"
    " WHERE id = ? AND state = 'pending'"
)
PENDING_AFTER = (
    "SELECT content, attachments FROM turns WHERE session_id = ? AND id > ? AND role = 'user'"
    " AND state IN ('pending', 'claimed') AND state = 'pending' ORDER BY id LIMIT 1"
)

UNSENT = "SELECT 1 FROM outbox WHERE session_id = ? AND state IN ('pending', 'claimed') LIMIT 1"


def fold(conn: apsw.Connection, turn_id: int, worker: str, now: float) -> list[int] | None:
    """Fold the session's pending messages after ``turn_id`` into it, in order, up to the first that must run
    on its own (a command, or one with attachments: its voice notes and files are read for its own turn).
    Returns their ids, or None when ``worker`` does not hold ``turn_id``."""
    row = conn.execute(HELD, (turn_id, worker)).fetchone()
    if row is None:
        return None
    folded = []
    for later_id, content, attachments in conn.execute(LATER_PENDING, (row[0], turn_id)).fetchall():
        if not _foldable(content, attachments):
            break
        conn.execute(FOLD, (turn_id, now, turn_id, later_id))
        folded.append(later_id)
    return folded


def pending_after(conn: apsw.Connection, session_id: int, turn_id: int) -> bool:
    """Whether a message of the session that may be folded came after ``turn_id`` and waits (read by a runner
    during a model call in interrupt mode)."""
    row = conn.execute(PENDING_AFTER, (session_id, turn_id)).fetchone()
    return row is not None and _foldable(*row)


def _foldable(content: str, attachments: str) -> bool:
    return not content.lstrip().startswith("/") and attachments in ("", "[]")


def answer_unsent(conn: apsw.Connection, session_id: int) -> bool:
    """Whether an earlier reply of the session still waits for the gateway (its platform's pace, most often)."""
    return conn.execute(UNSENT, (session_id,)).fetchone() is not None
