"""What the writer publishes: committed changes' events, its beat, streaming drafts, and their topics (via messages)."""

from __future__ import annotations

from schema.base import Int, Msg


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


class AnswerDraft(Event, kw_only=True):  # kw_only: required fields follow thread's default
    """The answer so far of a turn that is still being written (a hint: outside the writer's gap detection, so a
    lost one never makes a subscriber re-read). ``instance`` and ``chat`` are those of the turn's outbox rows
    (``chat`` whole, e.g. Slack's "<channel>:<thread_ts>"); ``thread`` is the part of ``chat`` after its first
    ":" (Slack's thread_ts, a Telegram forum topic), "" where there is none. ``seq`` counts per topic, apart
    from the committed events' (WriterBeat.seqs never holds it)."""

    instance: str
    chat: str
    thread: str = ""  # the reply's thread where the platform has one (Slack thread_ts, Telegram topic)
    session_id: Int
    turn_id: Int
    step: Int = 0  # model step within the turn (a tool call starts a new step)
    text: str  # the whole answer so far, not a delta: a lost hint loses nothing
    done: bool = False  # this step's text is complete


AnyEvent = TurnPending | OutboxPending | WriterBeat | CronChanged | AnswerDraft

TOPIC_TURN = "turn/"
TOPIC_BEAT = "beat/"
TOPIC_CRON = "cron/"


def topic_outbox(instance: str) -> str:
    """Outbox wake-ups for one gateway instance. The trailing slash keeps prefix matches exact."""
    return f"outbox/{instance}/"


def topic_draft(instance: str) -> str:
    """Streaming drafts (``AnswerDraft``) for one gateway instance; not part of any gap detection."""
    return f"draft/{instance}/"
