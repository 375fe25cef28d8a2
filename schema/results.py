"""What the writer answers a write with: every ``Result`` an ``Ack`` can carry (re-exported by messages)."""

from __future__ import annotations

from schema.base import Int, Msg


class Accepted(Msg):
    """An inbound message is stored as a pending turn (or was already)."""

    turn_id: Int
    session_id: Int
    duplicate: bool = False


class TurnClaim(Msg):
    """The turn a runner now holds, with what it needs to start."""

    turn_id: Int
    session_id: Int
    agent: str
    instance: str
    chat: str
    sender: str
    text: str
    attempt: Int
    lease_until: float
    platform_msg_id: str = ""  # the message being answered: replies quote it where the platform threads them
    alone: bool = False  # its runner died holding it: claim nothing else until it is done
    alone_waiting: bool = False  # a turn waits for a runner holding nothing: claim no more until yours are done


class NoWork(Msg):
    """Nothing to claim right now."""

    alone_waiting: bool = False  # a turn waits for a runner holding nothing: claim again once yours are done


class OutboxItem(Msg):
    id: Int
    instance: str
    chat: str
    kind: str
    body: str
    file_path: str
    reply_to: str
    attempt: Int
    session_id: Int = 0
    parts_sent: Int = 0  # platform messages of this row already delivered (a long text in parts)
    created_at: float = 0.0  # when it was queued: a gateway gives up on a row by its age, not its attempts
    approval_id: str = ""  # the approval this message asks for (buttons draw from it), "" for any other
    turn_id: Int = 0  # the turn whose outbox row this is (0: none): its streamed draft's placeholder is its own


class OutboxClaim(Msg):
    items: list[OutboxItem]
    lease_until: float


class Stored(Msg):
    """A write that creates a row: its id (turn, outbox, ...)."""

    id: Int


class Folded(Msg):
    """The messages folded into a turn, oldest first (none: nothing waited)."""

    ids: list[Int] = []


class Leased(Msg):
    lease_until: float


class Done(Msg):
    """A write that needs no answer beyond "committed"."""


class Checkpointed(Msg):
    busy: Int
    wal_pages: Int
    checkpointed_pages: Int


class BackedUp(Msg):
    path: str
    pages: Int
    seconds: float


class Pairing(Msg):
    """The answer to a pairing request. status: new | existing (the sender's unexpired code) | allowed
    (already paired: no code) | full (too many codes pending on this instance: try later)."""

    status: str
    code: str = ""
    expires_at: float = 0.0


class LoginRecorded(Msg):
    """A login attempt as recorded: the account's failed logins in a row since its last good one, and until
    when it is locked (0: not locked)."""

    failures: Int = 0
    locked_until: float = 0.0


class Queued(Msg):
    """An enqueue stored these outbox rows."""

    ids: list[Int]


class CronRunEnded(Msg):
    """A cron run's recorded outcome (ok | failed), the job's consecutive failures since, and whether
    this run disabled the job."""

    outcome: str
    consecutive_failures: Int
    disabled: bool = False


class Purged(Msg):
    """One retention step: rows deleted per table, files the sweeper removes next, whether more is due,
    and the step's time inside the writer's transaction."""

    rows: dict[str, Int] = {}
    files: list[str] = []
    more: bool = False
    ms: float = 0.0


class Enlisted(Msg):
    """A process is now the one under its name; what its (gone) predecessor held was taken back."""

    predecessor: str = ""  # the worker id it took over ("" when there was none)
    turns: list[Int] = []  # turns handed back to the queue at once
    outbox: list[Int] = []  # outbox rows handed back at once (their attempt counts: the call may have gone out)
    poisoned: list[Int] = []  # turns failed for having crashed their runner MAX_CRASHES times (the person told)


class ClockConfirmed(Msg):
    """What was accepted: how far the wall clock stood ahead of the writer's lease clock, unconfirmed
    (seconds; negative: behind), and whether retention was held for it."""

    jump_s: float
    held: bool = False


Result = (
    Accepted
    | TurnClaim
    | NoWork
    | OutboxClaim
    | Stored
    | Folded
    | Leased
    | Done
    | Checkpointed
    | BackedUp
    | Queued
    | Pairing
    | LoginRecorded
    | CronRunEnded
    | Purged
    | Enlisted
    | ClockConfirmed
)
