"""The wire contract between Starling's processes: every bus message, as tagged msgspec Structs.

Rules (DESIGN.md, "The bus"): a new field gets a default; a field's type never changes; decoding
validates; one union per socket. Sockets and their unions:

- writer ROUTER, client -> writer: ``RequestFrame``: a ``Request`` (an id, an idempotency key and one
  ``WriteOp``), or ``Requests`` carrying several in one frame
- writer ROUTER, writer -> client: ``AckFrame``: an ``Ack`` (the request's id and a ``Result`` or an
  error), or ``Acks`` bundling a client's acks from one group commit
- writer PUB -> subscribers: ``Event``, on a topic (see ``topic_for``)
"""

from __future__ import annotations

from typing import Annotated

import msgspec

# SQLite stores 64-bit signed integers: a larger one is refused when decoded, not when bound.
Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class Msg(msgspec.Struct, tag=True, frozen=True, kw_only=True):
    """Base of every wire message: tagged by class name, immutable."""


# ---------------------------------------------------------------- write operations


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """One message for the outbox: text, or a file with an optional caption."""

    text: str = ""
    file_path: str = ""
    reply_to: str = ""


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
    reply_to: str = ""
    attachments: list[str] = []
    meta: str = "{}"  # JSON object: platform details a runner may want (never secrets)


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


# ---------------------------------------------------------------- the dashboard's writes and the daemon log


class DaemonLogLine(msgspec.Struct, frozen=True, kw_only=True):
    """One warning or error line of a service, as its log wrote it (already redacted)."""

    at: float
    service: str
    level: str
    event: str
    detail: str = "{}"  # the line's other keys, JSON


class RecordDaemonLog(Msg):
    """A service's warnings and errors in a batch (common/daemon_log.py). Rows older than ``before`` (the
    retention) and beyond the newest ``max_rows`` go in the same commit. Answered ``Done``."""

    lines: list[DaemonLogLine]
    before: float = 0.0
    max_rows: Int = 100_000


class DashboardAccount(Msg):
    """A dashboard account change (`starling dashboard user`, the first-run setup link): ``action`` add |
    passwd | rm | role. A new password, a new role or a removal ends the account's sessions; audited with
    ``by``. ``first`` (the setup link): added only while no account exists. Answered ``Stored`` (the
    account's id)."""

    action: str
    username: str
    password_hash: str = ""  # argon2id (common/dashboard_accounts.py)
    role: str = ""
    by: str = ""
    first: bool = False


class DashboardLogin(Msg):
    """A login attempt, judged by the control service: ``ok`` opens a session (the token's SHA-256, its CSRF
    token, its expiry) and clears the account's failures; a failure counts against the account, locked for
    ``lock_s`` after ``lock_after`` in a row. Audited either way. Answered ``LoginRecorded``."""

    username: str
    address: str
    ok: bool
    reason: str = ""
    token_hash: str = ""
    csrf: str = ""
    expires_at: float = 0.0
    lock_after: Int = 5
    lock_s: float = 900.0


class DashboardLogout(Msg):
    """A dashboard session ends (logout). Answered ``Done``."""

    token_hash: str
    by: str = ""


class DashboardAudit(Msg):
    """A change made from the dashboard, in the audit with the account's name. Answered ``Stored``."""

    account: str
    action: str
    target: str = ""
    detail: str = "{}"  # JSON, no secret values


class RefusePairing(Msg):
    """An operator refuses a pending pairing code: it ends now (the sender may ask again later)."""

    code: str
    refused_by: str


class RevokeSender(Msg):
    """An operator takes an allowed sender's access to a gateway instance away."""

    instance: str
    sender: str
    revoked_by: str


# ---------------------------------------------------------------- the sweeper's writes
# A purge is one bounded step (at most ``max_rows`` rows and about ``max_ms`` inside the writer's
# transaction), answered by ``Purged``; the sweeper repeats it while ``more`` is true, so no step
# holds the write lock for long. Files named in the answer are removed by the sweeper after the ack.


class PurgeSessions(Msg):
    """Retention: delete conversations last active before ``before`` with their turns, delivered
    messages, tool audit and approvals (never one with a turn pending, running or parked); also
    delivered or failed outbox rows and inbound dedupe keys older than ``before``. ``Purged.files``:
    the attachments of the deleted turns."""

    before: float
    max_rows: Int = 2000
    max_ms: float = 40.0


class PurgeAudit(Msg):
    """Retention: delete audit rows, tool executions and finished cron runs (each job keeps its latest)
    older than ``before``."""

    before: float
    max_rows: Int = 5000
    max_ms: float = 40.0


class PurgeJobs(Msg):
    """Retention: delete background jobs that ended before ``before`` (never a running one);
    ``Purged.files``: their log files."""

    before: float
    max_rows: Int = 500
    max_ms: float = 40.0


class ResetSession(Msg):
    """A daily or idle reset closes an open conversation, unless it was active after
    ``last_active_at`` (what the sweeper saw) or has a turn pending, running or parked."""

    session_id: Int
    reason: str  # daily | idle
    last_active_at: float


class MarkCaptured(Msg):
    """These closed conversations are written to session memory (or passed over): never again."""

    session_ids: list[Int]


class DeadLetter(Msg):
    """A platform event a gateway passed over because it was refused for itself (it fails validation),
    kept whole for the operator (`starling status`, `starling doctor`). Answered ``Stored``."""

    platform: str
    instance: str
    event_key: str  # the event's own id (its first dedupe key); "" when it has none
    reason: str
    payload: str  # the event as the platform sent it (JSON text)
    received_at: float = 0.0


class ConfirmClock(Msg):
    """An operator checked the time: the wall clock as it is now is accepted, and retention, held since it
    jumped forward by more than a day (services/writer/lease_clock.py), runs again. Answered
    ``ClockConfirmed``."""

    by: str = ""  # who confirmed (for the audit row)


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


RequestFrame = Request | Requests


# ---------------------------------------------------------------- results and acks


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


class Event(Msg):
    """A committed change or a beat. ``seq`` counts per topic within one writer ``epoch``."""

    epoch: str
    seq: Int


class TurnPending(Event):
    session_id: Int
    turn_id: Int


class OutboxPending(Event):
    instance: str
    chat: str
    outbox_id: Int


class WriterBeat(Event):
    """Sent every heartbeat interval on the beat topic; ``seqs`` lets a subscriber see a lost tail."""

    schema_version: Int
    seqs: dict[str, Int] = {}


class CronChanged(Event):
    """A cron job was added, removed, enabled or disabled: the scheduler looks again now."""

    job_id: Int


AnyEvent = TurnPending | OutboxPending | WriterBeat | CronChanged

TOPIC_TURN = "turn/"
TOPIC_BEAT = "beat/"
TOPIC_CRON = "cron/"


def topic_outbox(instance: str) -> str:
    """Outbox wake-ups for one gateway instance. The trailing slash keeps prefix matches exact."""
    return f"outbox/{instance}/"
