"""The wire contract between Starling's processes: every bus message, as tagged msgspec Structs.

Rules (DESIGN.md, "The bus"): a new field gets a default; a field's type never changes; decoding
validates; one union per socket. Sockets and their unions:

- writer ROUTER, client -> writer: ``RequestFrame``: a ``Request`` (an id, an idempotency key and one
  ``WriteOp``), or ``Requests`` carrying several in one frame, or a ``ShowDraft`` hint (published, never
  committed nor acked)
- writer ROUTER, writer -> client: ``AckFrame``: an ``Ack`` (the request's id and a ``Result`` or an
  error), or ``Acks`` bundling a client's acks from one group commit
- writer PUB -> subscribers: ``AnyEvent``, on a topic (``TOPIC_*``, ``topic_outbox``, ``topic_draft``)

The dashboard's and housekeeping writes are in admin_ops.py, the results in results.py, the events in
events.py, the base in base.py; all are named here, so every process uses ``m.<Name>``.
"""

from __future__ import annotations

import msgspec

from schema.base import Int, Msg  # noqa: F401

# ---------------------------------------------------------------- write operations


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """One message for the outbox: text, or a file with an optional caption."""

    text: str = ""
    file_path: str = ""
    reply_to: str = ""
    approval_id: str = ""  # the approval this message asks for: a platform with buttons draws them from it


CHAT_KINDS = ("private", "group", "channel")  # Inbound.chat_kind


class Inbound(Msg):
    """A person's message from a gateway becomes a pending user turn.

    ``dedupe_keys`` are the platform's ids for this event (Telegram: the update id and the
    (chat, message_id) pair). If any of them was seen before, the write is a no-op that returns
    the first turn's id with ``duplicate=True``.
    """

    agent: str
    instance: str
    chat: str
    sender: str
    dedupe_keys: list[str]
    text: str = ""
    sender_name: str = ""
    platform_msg_id: str = ""
    reply_to: str = ""  # the platform's id of the message this one answers
    attachments: list[str] = []
    thread: str = ""  # the platform's thread or topic id within the chat's room ("": none)
    chat_kind: str = "private"  # private | group | channel
    edit_of: str = ""  # an edit: the platform's id of the message edited ("": a new message)
    sent_at: float = 0.0  # the platform's timestamp of the message, seconds since the epoch (0: not given)


class ClaimTurn(Msg):
    """A runner asks for the next turn it may work on (one session's turns in order, one at a time)."""

    worker: str
    lease_s: float = 60.0
    # the runner holds no other turn: it may be given one that must run alone (its runner died holding it)
    alone: bool = False
    alert_to: str = ""  # "instance:chat" told when a turn is failed for crashing its runner ([health] alert_to)


class RenewLease(Msg):
    """The holder of a claim extends its lease while it works."""

    kind: str  # "turn" | "outbox"
    id: Int
    worker: str
    lease_s: float = 60.0


class AppendTurn(Msg):
    """A runner records a turn in the middle of its work (an assistant tool call, a tool result)."""

    session_id: Int
    worker: str
    role: str  # "assistant" | "tool" | "system" | "summary"
    content: str = ""
    meta: str = "{}"
    parent_turn_id: Int = 0  # the user turn this belongs to (0: none)


class FinishTurn(Msg):
    """A runner is done with a claimed turn: its answer is stored and queued for delivery, in one commit."""

    turn_id: Int
    worker: str
    ok: bool = True
    error: str = ""
    answer: str = ""  # the assistant's final text, stored as a turn ("" stores none)
    replies: list[Reply] = []  # what goes to the chat
    meta: str = "{}"


class FoldTurns(Msg):
    """The holder of a turn folds the session's later pending messages into it ([conversation] queue =
    "collect"): each is marked done under the turn, which answers them all. Answered ``Folded``;
    ``lease_lost`` unless ``worker`` holds the turn."""

    turn_id: Int
    worker: str


class SetTurnText(Msg):
    """The runner holding a user turn's lease rewrites its text: a voice note's line becomes its transcript
    (or says why not). Answered ``Done``; ``lease_lost`` unless ``worker`` holds the turn."""

    turn_id: Int
    worker: str
    content: str


class DraftSkill(Msg):
    """An agent proposes a skill (the skill_draft tool): stored as a draft for the operator to approve or
    reject. A draft of the same agent and name not yet decided is replaced. Answered ``Stored`` (its id)."""

    agent: str
    name: str
    description: str
    body: str
    session_id: Int = 0
    turn_id: Int = 0  # the turn whose tool call proposed it: only that turn's lease holder may (0: none)
    worker: str = ""


class DecideSkillDraft(Msg):
    """The operator's decision on a draft (`starling skills approve|reject`): "accepted" once its SKILL.md
    is written and listed, or "rejected". Answered ``Done``; ``not_found`` unless the draft is undecided."""

    id: Int
    state: str  # accepted | rejected


class ReleaseTurn(Msg):
    """A runner hands a claimed turn back untouched (shutdown): another runner takes it at once."""

    turn_id: Int
    worker: str


class EnqueueOutbox(Msg):
    """Queue a message for a chat that no turn produced (a cron answer, a health alert, a pairing code)."""

    instance: str
    chat: str
    replies: list[Reply]
    session_id: Int = 0
    # sent by a tool during a turn: only the holder of that turn's lease may (0 / "": no turn)
    turn_id: Int = 0
    worker: str = ""
    alert: bool = False  # an operator alert: queued even while the data disk is full (the writer's reserve)


class ClaimOutbox(Msg):
    """A gateway claims deliverable outbox rows of its instances (the head of each chat's queue).

    ``chats`` narrows the claim to some chats (`starling chat` claims only its own)."""

    worker: str
    instances: list[str]
    chats: list[str] = []
    limit: Int = 16
    lease_s: float = 30.0


class OutboxSent(Msg):
    """A gateway delivered an outbox row."""

    id: Int
    worker: str
    platform_msg_id: str = ""


class OutboxFailed(Msg):
    """A delivery failed: retry after ``retry_after_s``, or never when it is negative."""

    id: Int
    worker: str
    error: str
    retry_after_s: float = -1.0


class OutboxProgress(Msg):
    """A held outbox row went out in part: ``parts_sent`` platform messages are delivered (a gateway
    that takes the row over later starts after them)."""

    id: Int
    worker: str
    parts_sent: Int
    platform_msg_id: str = ""


class RecordDelivery(Msg):
    """A platform's delivery status for a message it accepted (WhatsApp: sent, delivered, read, failed),
    found by the platform's message id. Statuses come in any order; a later stage never goes back."""

    instance: str
    platform_msg_id: str
    status: str
    error: str = ""


class ReleaseOutbox(Msg):
    """A gateway hands claimed rows back (shutdown). ``all_held``: every row ``worker`` holds, whatever
    ``ids`` says (a restarted gateway taking its predecessor's rows back at once). ``untouched``: the
    rows were never tried, so their attempt is given back; else it counts (the call may have gone out)."""

    ids: list[Int]
    worker: str
    all_held: bool = False
    untouched: bool = True


class Heartbeat(Msg):
    """A service says it is alive; the writer records it for `status` and `/health`."""

    service: str
    pid: Int
    state: str = "ready"  # starting | ready | idle | stopped
    detail: str = ""
    parent_pid: Int = 0  # the supervisor's pid: a new one (a new `up`) restarts the restart count
    worker: str = ""  # the process's worker id (``Enlist``): a beat keeps it known alive; a superseded one is refused


class Enlist(Msg):
    """A process starts under a name (``--name``): its identity is recorded, and what a predecessor under
    that name still holds (turns, outbox rows) is taken back at once, but only when the predecessor is
    provably gone (common/identity.py). A live one refuses the newcomer (``conflict``, naming its pid and
    since when). Answered ``Enlisted``."""

    name: str
    worker: str  # <name>@<host>/<boot>: unique to this process
    pid: Int
    pid_start: Int = 0  # the pid's start time (clock ticks since boot): a reused pid is not this process
    host: str = ""
    pid_scope: str = ""  # <host boot id>:<pid namespace>
    stale_after_s: float = 180.0  # a predecessor silent this long (no beat) counts as gone where its pid cannot be checked
    alert_to: str = ""  # "instance:chat" told when a turn the predecessor held is failed for crashing it


class Ping(Msg):
    """Asks the writer for an ack and nothing else (readiness, liveness)."""


class Checkpoint(Msg):
    """Run a WAL checkpoint now."""

    mode: str = "truncate"  # passive | full | restart | truncate


class Backup(Msg):
    """Write a consistent online copy of the database to ``path`` while writes go on."""

    path: str


class FtsRebuild(Msg):
    """Rebuild the recall index from the turns table."""


class CloseSession(Msg):
    """End a conversation (/new, a reset): the chat's next message opens a fresh session."""

    session_id: Int
    reason: str = "new"


class SetSummary(Msg):
    """Compaction: turns up to ``upto_turn_id`` are now represented by ``summary`` in the prompt."""

    session_id: Int
    summary: str
    upto_turn_id: Int


class RecordTool(Msg):
    """Audit of one tool execution (arguments already redacted)."""

    session_id: Int
    turn_id: Int
    agent: str
    tool: str
    arguments: str = "{}"
    outcome: str = "ok"  # ok | error | refused | denied | pending
    result_path: str = ""
    error: str = ""
    duration_ms: float = 0.0


class RecordUsage(Msg):
    """Tokens and cost of one model call."""

    session_id: Int
    turn_id: Int
    agent: str
    provider: str
    model: str
    input_tokens: Int = 0
    output_tokens: Int = 0
    cost_usd: float = 0.0


class ParkTurn(Msg):
    """A claimed turn waits for a person's decision: the approval is stored and the lease released.

    The writer answers ``Stored`` with nothing new; when the approval is decided, the turn is pending
    again and is claimed and resumed like any other.
    """

    turn_id: Int
    worker: str
    approval_id: str
    tool: str
    arguments: str = "{}"
    reason: str = ""
    ttl_s: float = 3600.0
    notice: str = ""  # queued to the turn's chat in the same commit ("approve with /approve ID ...")


class DecideApproval(Msg):
    """A person approves or denies a pending approval; ``always`` also stores a standing grant."""

    approval_id: str
    approve: bool
    decided_by: str
    always: bool = False
    grant_pattern: str = ""  # the grant's scope, e.g. the command prefix; "" = this exact call


class CronAdd(Msg):
    """Create a cron job (a cron expression in a time zone, or a one-shot ``run_at``)."""

    name: str
    prompt: str
    agent: str
    deliver_instance: str
    deliver_chat: str
    schedule: str = ""
    tz: str = "UTC"
    run_at: float = 0.0
    created_by: str = ""
    misfire_grace_s: float = 0.0  # how late a missed fire may still run; 0: derived from the period
    active_since: float = 0.0  # fires count from this time on; 0: the writer's now


class CronRemove(Msg):
    name: str


class CronSetEnabled(Msg):
    """Enable or disable a cron job by name. Enabling counts its fires from ``active_since`` (0: the
    writer's now: fires missed while it was disabled are neither run nor recorded) and clears its failures."""

    name: str
    enabled: bool
    reason: str = ""
    active_since: float = 0.0


class CronFire(Msg):
    """The scheduler fires a job: its run row keyed by (job, scheduled time) and the agent turn, in one
    commit. A second fire of the same (job, time) is a no-op answering ``Accepted(duplicate=True)``."""

    job_id: Int
    scheduled_for: float
    started_at: float = 0.0  # the scheduler's clock; 0: the writer's now


class CronSkip(Msg):
    """The scheduler records fires that will not run (missed past their grace, or the previous run was
    still going); times that already have a run row are left as they are."""

    job_id: Int
    scheduled_for: list[float]
    reason: str
    at: float = 0.0


class CronRunEnd(Msg):
    """A fired run's turn has ended: the writer records its outcome from the turn, counts consecutive
    failures, and at ``max_consecutive_failures`` (0: never) disables the job and queues an alert to
    ``alert_instance:alert_chat`` when given, all in one commit."""

    run_id: Int
    max_consecutive_failures: Int = 0
    alert_instance: str = ""
    alert_chat: str = ""


class JobStarted(Msg):
    """A background command started; its output goes to ``log_path`` under data/jobs/."""

    agent: str
    session_id: Int
    command: str
    log_path: str
    pid: Int


class JobEnded(Msg):
    job_id: Int
    state: str  # done | failed | killed
    exit_code: Int = 0


class RequestPairing(Msg):
    """A stranger wrote to a gateway instance: give them a pairing code (or the one they already have).

    Nothing they send reaches an agent until `starling pairing approve CODE`."""

    instance: str
    sender: str
    chat: str
    sender_name: str = ""


class ApprovePairing(Msg):
    """An operator approves a pairing code: its sender may talk to the instance's agent from now on."""

    code: str
    approved_by: str


from schema.admin_ops import (  # noqa: F401 - part of the contract, named here as m.<Name>
    DaemonLogLine, RecordDaemonLog, DashboardAccount, DashboardLogin, DashboardLogout, DashboardAudit,
    RefusePairing, RevokeSender, PurgeSessions, PurgeAudit, PurgeJobs, ResetSession, MarkCaptured, DeadLetter,
    ConfirmClock,
)

WriteOp = (
    Inbound
    | ClaimTurn
    | RenewLease
    | AppendTurn
    | FinishTurn
    | ReleaseTurn
    | DraftSkill
    | DecideSkillDraft
    | SetTurnText
    | FoldTurns
    | EnqueueOutbox
    | ClaimOutbox
    | OutboxSent
    | OutboxFailed
    | ReleaseOutbox
    | OutboxProgress
    | RecordDelivery
    | Heartbeat
    | Ping
    | Checkpoint
    | Backup
    | FtsRebuild
    | CloseSession
    | SetSummary
    | RecordTool
    | RecordUsage
    | ParkTurn
    | DecideApproval
    | CronAdd
    | CronRemove
    | CronSetEnabled
    | CronFire
    | CronSkip
    | CronRunEnd
    | JobStarted
    | JobEnded
    | RequestPairing
    | ApprovePairing
    | RecordDaemonLog
    | DashboardAccount
    | DashboardLogin
    | DashboardLogout
    | DashboardAudit
    | RefusePairing
    | RevokeSender
    | PurgeSessions
    | PurgeAudit
    | PurgeJobs
    | ResetSession
    | MarkCaptured
    | DeadLetter
    | Enlist
    | ConfirmClock
)


class Request(Msg):
    """Client -> writer. ``id`` matches the ack; ``key`` makes a resend or replay a no-op."""

    id: Int
    key: str
    op: WriteOp


class Requests(Msg):
    """Several requests of one client in one frame (those its callers made in one turn of its event
    loop): each is applied, answered and resent exactly as if it had come alone."""

    requests: list[Request]


class ShowDraft(Msg, kw_only=True):
    """Runner -> writer, fire and forget: the answer so far of a turn's model step, for the writer to publish as an
    ``AnswerDraft`` on ``topic_draft(instance)``. A hint, not a write: never committed, never acked, never resent;
    losing one loses nothing (the next one, or the final outbox row, carries the whole text)."""

    instance: str
    chat: str
    thread: str = ""
    session_id: Int
    turn_id: Int
    step: Int = 0
    text: str
    done: bool = False


RequestFrame = Request | Requests | ShowDraft


# ---------------------------------------------------------------- results and acks

from schema.results import (  # noqa: F401 - part of the contract, named here as m.<Name>
    Accepted, TurnClaim, NoWork, OutboxItem, OutboxClaim, Stored, Folded, Leased, Done, Checkpointed,
    BackedUp, Pairing, LoginRecorded, Queued, CronRunEnded, Purged, Enlisted, ClockConfirmed, Result,
)

class Ack(Msg):
    """Writer -> client, sent only after the request's effects are committed (or it failed)."""

    id: Int
    ok: bool
    result: Result | None = None
    # on failure: invalid | not_found | lease_lost | conflict | internal | too_large, or the writer's own
    # condition (common/errors.py WRITER_CONDITIONS: nothing was stored, send it again): disk_full | io_error | busy
    code: str = ""
    error: str = ""


class Acks(Msg):
    """Several acks for one client from one group commit, in one frame."""

    acks: list[Ack]


AckFrame = Ack | Acks


# ---------------------------------------------------------------- events

from schema.events import (  # noqa: F401 - part of the contract, named here as m.<Name>
    Event, TurnPending, OutboxPending, WriterBeat, CronChanged, AnswerDraft, AnyEvent,
    TOPIC_TURN, TOPIC_BEAT, TOPIC_CRON, topic_outbox, topic_draft,
)
