"""The contract between the shared gateway and a platform: a Channel per configured instance."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, NamedTuple

from schema import messages as m

if TYPE_CHECKING:
    from services.gateway.base import Gateway


@dataclass
class InboundMessage:
    """One platform message, ready for the writer. ``dedupe_keys`` come from the platform's own ids
    (update id, message id, event id): a redelivery carries the same ones and is never a second turn."""

    chat: str
    sender: str
    text: str
    dedupe_keys: list[str]
    private: bool = True      # a direct chat (strangers get a pairing code there, nowhere else)
    addressed: bool = True    # in a group: the bot was mentioned, replied to, or given a command
    sender_name: str = ""
    platform_msg_id: str = ""
    reply_to: str = ""
    attachments: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    command: str = ""         # a command the gateway answers itself ("/start"); others go to the runner
    room: str = ""            # in a group: the id `allow` names (a Slack channel for a thread's chat); "" = chat


class Skip(NamedTuple):
    """A platform event that is not a message for the agent (malformed, unknown, a bot's own): why."""

    reason: str


@dataclass
class FileRef:
    """A file attached to an inbound message, fetched only once the sender passed the access check."""

    kind: str   # photo, document, voice note, image, ...: what the agent is told
    ref: str    # the platform's handle: a Telegram file_id, a Slack download URL, a WhatsApp media id
    size: int   # as the platform announced it (0: unknown)
    name: str


@dataclass
class Parsed:
    msg: InboundMessage
    files: list[FileRef] = field(default_factory=list)
    date: float = 0.0  # when it was sent (the attachments folder's date)


class Sent(NamedTuple):
    platform_msg_id: str = ""


class Retry(NamedTuple):
    """Not delivered yet: try again after ``after_s`` (a platform's retry_after, or a backoff)."""

    after_s: float
    error: str


class Failed(NamedTuple):
    """Never deliverable (blocked by the user, chat gone, file too large): marked failed, not retried."""

    error: str


Outcome = Sent | Retry | Failed
Progress = Callable[[int, str], Awaitable[None]]  # (parts delivered so far, the last part's message id)


class Channel:
    """One instance of a platform (a bot, a workspace, a number). Subclasses implement the I/O."""

    platform = ""
    senders_in_groups = False  # True: an allowed sender is answered in any group, not only in allowed ones
    # True: the platform's retries end sooner than a writer outage may last (Slack), so events are
    # acknowledged once in the process's spool (services/gateway/spool.py), replayed by handle_spooled
    spools = False

    @staticmethod
    def normalize_id(value: str) -> str:
        """A sender or chat id as the platform spells it (WhatsApp: digits only, so "+49 151..." matches)."""
        return value

    def __init__(self, gateway: Gateway, cfg) -> None:
        self.gateway = gateway
        self.cfg = cfg
        self.id: str = cfg.id
        self.agent: str = cfg.agent
        self.log = gateway.log.bind(instance=cfg.id)
        self.status = "starting"  # shown in heartbeats: polling, webhook, error: ...
        self.started = False  # start() succeeded: its outbox rows are claimed from then on

    def register_webhooks(self) -> None:
        """Add this instance's routes to ``self.gateway.webhooks`` (webhook transports only)."""

    async def start(self) -> None:
        """Connect and check credentials; raise StarlingError with an operator-readable reason."""

    async def receive(self) -> None:
        """Receive forever (a polling or socket loop); webhook transports just wait."""

    async def handle_spooled(self, event: dict) -> None:
        """Hand an event from the spool (as the channel spooled it) to the writer (``spools`` only)."""
        raise NotImplementedError

    async def send(self, item: m.OutboxItem, progress: Progress) -> Outcome:
        raise NotImplementedError

    async def typing(self, chat: str, platform_msg_id: str) -> None:
        """Show that the agent is working on ``platform_msg_id`` in ``chat`` (best effort; called every few s)."""

    async def typing_done(self, chat: str, platform_msg_id: str) -> None:
        """The turn is over: take the sign down where the platform does not do it by itself."""

    async def close(self) -> None:
        """Release connections; called once at stop."""
