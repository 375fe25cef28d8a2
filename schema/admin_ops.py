"""Writes of the dashboard and of the housekeeping (the sweeper's purges and resets, dead letters, the
clock's confirmation): part of ``messages.WriteOp``, re-exported there."""

from __future__ import annotations

import msgspec

from schema.base import Int, Msg


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
