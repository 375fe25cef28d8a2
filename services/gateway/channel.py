"""The contract between the shared gateway and a platform: a Channel per configured instance.

A platform supplies its parser (``Channel.parse``: one event as the platform sent it -> Parsed or Skip),
``Channel.download`` (one file's bytes) and its acknowledgement (the HTTP 200, the envelope ack, the
next offset), which it gives once ``Gateway.take`` returned; the kit (services/gateway/base.py) does the
rest, once for every platform: access, downloads, the hand-off to the writer, a chat's order. Outbound,
it supplies an ``Outbound`` (``Channel.outbound``: its calls, renderer, limits and error meanings); the
kit (services/gateway/delivery.py) claims, renders, splits, sends and records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, NamedTuple

from services.gateway.order import Window

if TYPE_CHECKING:
    from services.gateway.base import Gateway
    from services.gateway.delivery import Outbound

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
    reply_to: str = ""        # the platform's id of the message this one answers ("": none)
    attachments: list[str] = field(default_factory=list)
    command: str = ""         # a command the gateway answers itself ("/start"); others go to the runner
    room: str = ""            # in a group: the id `allow` names (a Slack channel for a thread's chat); "" = chat
    thread: str = ""          # the platform's thread or topic id within the room ("": none)
    chat_kind: str = ""       # private | group | channel (schema CHAT_KINDS; "": private when ``private``, else group)
    edit_of: str = ""         # an edit: the platform's id of the message edited ("": a new message)
    sent_at: float = 0.0      # the platform's timestamp of the message, seconds (0: not given)

    def __post_init__(self) -> None:
        self.chat_kind = self.chat_kind or ("private" if self.private else "group")


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
    files: list[FileRef] = field(default_factory=list)  # fetched by the kit (Channel.download) once allowed


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
    # acknowledged once in the process's spool (services/gateway/spool.py), replayed through Gateway.take
    spools = False
    # a Window: a chat's messages are handed to the writer in the order of their timestamps (ties: arrival),
    # a message waiting briefly for one sent before it that may come after it (services/gateway/order.py);
    # None: in the order they arrive
    reorder: Window | None = None
    event_name = "event"  # what the platform calls an event, in log lines ("update_skipped")

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

    # ------------------------------------------------------------ inbound (called by the kit)

    def parse(self, event: object) -> Parsed | Skip:
        """One event as the platform sent it (and as the spool and dead letters keep it) -> a message."""
        raise NotImplementedError

    def addressed(self, msg: InboundMessage) -> bool:
        """Whether a group message is for the agent, judged again once the chat's earlier messages are
        stored (Slack: a reply right behind the mention that started its thread)."""
        return msg.addressed

    async def download(self, ref: FileRef) -> AsyncIterator[bytes]:
        """One file's bytes (only for a sender who passed the access check); raise StarlingError, OSError
        or ValueError when it cannot be fetched: the agent is told why instead."""
        raise NotImplementedError

    def fetch_budget_s(self) -> float:
        """How long all the files of one message may take (a webhook must be answered first)."""
        return 120.0

    def stored(self, msg: InboundMessage) -> None:
        """A new message was stored (not a duplicate): a read receipt, a note of the thread (best effort)."""

    # ------------------------------------------------------------ outbound (called by the kit)

    def outbound(self) -> Outbound | None:
        """This instance's half of the outbound path (services/gateway/delivery.py): its API calls, renderer,
        limits and error meanings, through which the kit sends its outbox rows and streamed drafts. None
        while there is none yet (not started): its rows are tried again later."""
        return None

    async def typing(self, chat: str, platform_msg_id: str) -> None:
        """Show that the agent is working on ``platform_msg_id`` in ``chat`` (best effort; called every few s)."""

    async def typing_done(self, chat: str, platform_msg_id: str) -> None:
        """The turn is over: take the sign down where the platform does not do it by itself."""

    async def close(self) -> None:
        """Release connections; called once at stop."""
