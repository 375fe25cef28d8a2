"""Linked-device mode, the parts that do not speak the protocol: the interface a client library sits
behind (`LinkedClient`, reporting to `Events`), the link's state machine and reconnect policy, and the
mapping of its messages and send errors onto the kit's (``parse``: Parsed | Skip for Gateway.take;
``outcome``: Sent | Retry | Failed for delivery.py).

A client reports what happens through ``Events``; the gateway's `LinkedTransport` (linked_transport.py)
implements them and drives the client; `starling whatsapp link` drives pairing through the same calls.
The real client is neonize (neonize_client.py); tests pass a fake behind the same interface in
(``make_client``: tests/linked_gateway.py starts the gateway with it), production code loads none by name.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

from common.errors import StarlingError
from services.gateway.channel import Failed, FileRef, InboundMessage, Outcome, Parsed, Retry, Skip
from services.gateway.delivery import backoff as outbox_backoff
from services.gateway.whatsapp.session_vault import SessionVault

LINK_KEY = "link"  # the store's record of the link: {account, linked_at, session, logged_out}
INSTALL_HINT = "pip install -e '.[whatsapp-linked]'"


# ---------------------------------------------------------------- what a client reports


class LogoutReason(enum.Enum):
    DEVICE_REMOVED = "device removed: this device was removed under Linked devices on the phone, or logged out"
    REPLACED = "another client took over: the same session connected from elsewhere"
    MAIN_DEVICE_GONE = "the phone's account is gone (WhatsApp removed or re-registered on the phone)"
    BANNED = "the account is banned"
    CLIENT_OUTDATED = "WhatsApp refused this client version: upgrade neonize"
    UNLINKED = "unlinked by the operator (`starling whatsapp unlink`)"
    UNKNOWN = "logged out by WhatsApp for an unknown reason"

    @property
    def session_dead(self) -> bool:
        """The stored keys are worthless now (REPLACED is not: restarting the gateway takes the session back)."""
        return self is not LogoutReason.REPLACED


@dataclass(frozen=True)
class LinkedMessage:
    """One message as a linked client received it."""

    id: str
    chat: str               # a person: the number, digits only; a group: "<id>@g.us"
    sender: str             # the sender's number (digits); in a private chat the same as chat
    text: str = ""
    sender_name: str = ""
    timestamp: float = 0.0
    group: bool = False
    from_me: bool = False   # sent by the account itself (the phone, another linked device, or us)
    mentions_me: bool = False
    reply_to: str = ""      # the id of the quoted message
    kind: str = "text"      # text | image | audio | voice note | video | document | sticker | <other>
    file_name: str = ""
    media: str = ""         # the client's handle for the file's bytes (LinkedClient.download); "": not fetched


class Events(Protocol):
    """What a client tells its owner. Each call returns once the owner has dealt with it; for ``message``
    that is after the writer acked it (a client that can hold its platform ack until then should)."""

    async def qr(self, code: str) -> None: ...
    async def pair_code(self, code: str) -> None: ...
    async def paired(self, account: str) -> None: ...
    async def connected(self, account: str) -> None: ...
    async def disconnected(self, reason: str) -> None: ...
    async def logged_out(self, reason: LogoutReason, detail: str = "") -> None: ...
    async def message(self, msg: LinkedMessage) -> None: ...


class SendKind(enum.Enum):
    NOT_CONNECTED = "not connected"
    NETWORK = "network"
    RATE_LIMITED = "rate limited"
    LOGGED_OUT = "logged out"
    NO_ACCOUNT = "the number is not on WhatsApp"
    TOO_LARGE = "too large"
    REJECTED = "rejected"


class SendError(StarlingError):
    def __init__(self, kind: SendKind, detail: str = "", retry_after_s: float = 0.0) -> None:
        super().__init__(f"{kind.value}{': ' + detail if detail else ''}")
        self.kind = kind
        self.detail = detail
        self.retry_after_s = retry_after_s


class ConnectError(StarlingError):
    """A connection attempt could not start (the network, the library): the reconnect policy retries."""


class LinkedClient(ABC):
    """A WhatsApp Web multi-device client for one instance. It keeps every key it needs in ``store``
    (directly, or as the neonize adapter does, in a working copy it saves back) and reports to ``events``."""

    def __init__(self, instance: str, store: SessionVault, events: Events, log) -> None:
        self.instance = instance
        self.store = store
        self.events = events
        self.log = log

    @abstractmethod
    async def connect(self) -> None:
        """Make sure a connection attempt with the stored session is under way (a no-op while one is);
        ``events.connected``, ``disconnected`` or ``logged_out`` follow. Raises ConnectError."""

    @abstractmethod
    async def pair(self, phone: str = "") -> None:
        """Connect without a session and start linking: ``events.qr`` (again as codes expire), or with
        ``phone`` (digits) ``events.pair_code`` once; then ``events.paired`` and ``events.connected``."""

    @abstractmethod
    async def logout(self) -> None:
        """Remove this device from the account (needs a connection); raises SendError when it cannot."""

    @abstractmethod
    async def send_text(self, chat: str, text: str, reply_to: str = "") -> str:
        """Send and return the message id; raises SendError."""

    @abstractmethod
    async def send_file(self, chat: str, path: Path, caption: str = "") -> str:
        """Send an image (jpeg/png) or a document and return the message id; raises SendError."""

    async def download(self, media: str) -> bytes:
        """The bytes of a received file by its ``LinkedMessage.media`` handle; raises StarlingError or OSError."""
        raise StarlingError("this client does not fetch files")

    async def mark_read(self, chat: str, sender: str, ids: list[str]) -> None:
        """Blue ticks (best effort)."""

    async def typing(self, chat: str, on: bool) -> None:
        """The "typing…" sign in ``chat`` (best effort)."""

    @abstractmethod
    async def close(self) -> None:
        """Disconnect, save what is unsaved, and leave no plaintext behind."""


MakeClient = Callable[[str, SessionVault, Events, object], LinkedClient]


def client_factory() -> MakeClient:
    """The class that makes linked clients in production: neonize's adapter. Raises StarlingError with what
    to install when neonize is missing."""
    from services.gateway.whatsapp.neonize_client import NeonizeClient, require_neonize

    require_neonize()
    return NeonizeClient


# ---------------------------------------------------------------- the link record


@dataclass
class LinkRecord:
    account: str = ""       # the linked number
    linked_at: float = 0.0
    session: str = ""       # a random id per link, so a new link is told from the one that ended
    logged_out: str = ""    # a LogoutReason name once the session is dead

    @classmethod
    def read(cls, store: SessionVault) -> LinkRecord | None:
        raw = store.get(LINK_KEY)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return cls(str(data.get("account", "")), float(data.get("linked_at", 0)), str(data.get("session", "")),
                       str(data.get("logged_out", "")))
        except (ValueError, AttributeError, TypeError):
            return cls(logged_out=LogoutReason.UNKNOWN.name)

    def write(self, store: SessionVault) -> None:
        store.put(LINK_KEY, json.dumps(self.__dict__).encode())

    @property
    def usable(self) -> bool:
        return bool(self.session) and not self.logged_out


# ---------------------------------------------------------------- the state machine


class State(enum.Enum):
    UNLINKED = "unlinked"
    LINKING = "linking"
    CONNECTING = "connecting"
    LINKED = "linked"
    LOGGED_OUT = "logged out"


ALLOWED = {
    State.UNLINKED: {State.LINKING, State.CONNECTING},
    State.LINKING: {State.CONNECTING, State.LINKED, State.UNLINKED, State.LOGGED_OUT},
    State.CONNECTING: {State.CONNECTING, State.LINKED, State.LOGGED_OUT, State.UNLINKED},
    State.LINKED: {State.CONNECTING, State.LOGGED_OUT, State.UNLINKED},
    State.LOGGED_OUT: {State.UNLINKED, State.LINKING, State.CONNECTING},
}


class Link:
    """Where one instance's link stands, and the one line `starling status` shows for it.

    unlinked → linking (pairing) → connecting → linked; a drop goes back to connecting, with the attempt
    number and when the next one is due; logged out (with the reason) stops reconnecting."""

    def __init__(self, instance: str, on_change: Callable[[Link], None] | None = None) -> None:
        self.instance = instance
        self.state = State.UNLINKED
        self.reason = ""
        self.account = ""
        self.attempt = 0
        self.next_at = 0.0     # wall time of the next connection attempt (connecting after a drop)
        self.since = time.time()
        self.on_change = on_change

    def to(self, state: State, reason: str = "", *, attempt: int = 0, next_at: float = 0.0) -> None:
        if state is not self.state and state not in ALLOWED[self.state]:
            raise ValueError(f"link {self.instance}: {self.state.value} → {state.value} is not a valid change")
        changed = (state, reason, attempt) != (self.state, self.reason, self.attempt)
        self.state, self.reason, self.attempt, self.next_at = state, reason, attempt, next_at
        if changed:
            self.since = time.time()
            if self.on_change:
                self.on_change(self)

    def resume(self, state: State, reason: str = "") -> None:
        """Where a stored link left off (a restarted gateway): set, not a change the machine checks."""
        self.state, self.reason, self.attempt, self.next_at = state, reason, 0, 0.0
        if self.on_change:
            self.on_change(self)

    def status(self) -> str:
        who = f" as +{self.account}" if self.account else ""
        if self.state is State.LINKED:
            return f"linked{who}"
        if self.state is State.CONNECTING:
            if not self.attempt:
                return f"connecting{who}"
            at = time.strftime("%H:%M:%S", time.localtime(self.next_at)) if self.next_at > time.time() else ""
            return (f"connecting{who} (attempt {self.attempt + 1}" + (f" at {at}" if at else "")  # a beat repeats it:
                    + (f"; last: {self.reason}" if self.reason else "") + ")")  # a time, not a countdown
        if self.state is State.LOGGED_OUT:
            return (f"logged out: {self.reason}; not reconnecting, run `starling whatsapp link {self.instance}`")
        if self.state is State.LINKING:
            return "linking: waiting for the phone"
        return f"unlinked{': ' + self.reason if self.reason else ''}; run `starling whatsapp link {self.instance}`"


@dataclass
class Backoff:
    """The wait before reconnection attempt ``n`` (1, 2, …): doubling from ``first_s`` up to ``cap_s``,
    then less a random share of up to ``jitter`` so many gateways that lost the network together do
    not come back in step. Always within [cap·(1−jitter), cap] once capped; never above ``cap_s``."""

    first_s: float = 2.0
    cap_s: float = 300.0
    factor: float = 2.0
    jitter: float = 0.3
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int) -> float:
        base = min(self.cap_s, self.first_s * self.factor ** max(0, attempt - 1))
        return base * (1.0 - self.jitter * self.rng.random())


# ---------------------------------------------------------------- inbound


def as_event(msg: LinkedMessage) -> dict:
    """A received message as the kit takes it (Gateway.take), and as dead letters keep it: its fields."""
    return dataclasses.asdict(msg)


def parse(event: object, instance: str) -> Parsed | Skip:
    """The linked client's event (``as_event(msg)``) as the kit takes it: the message, and its file to fetch
    (``LinkedClient.download``) when the client has a handle for it."""
    if not isinstance(event, dict):
        return Skip("a message event that is not an object")
    try:
        msg = LinkedMessage(**event)
    except TypeError as exc:
        return Skip(f"a message event with unknown fields ({exc})")
    inbound = to_inbound(msg, instance)
    if isinstance(inbound, Skip) or not msg.media or msg.kind == "text":
        return inbound if isinstance(inbound, Skip) else Parsed(inbound)
    name = msg.file_name or f"{msg.kind.replace(' ', '-')}-{msg.id}"
    return Parsed(inbound, [FileRef(msg.kind, msg.media, 0, name)])


def to_inbound(msg: LinkedMessage, instance: str) -> InboundMessage | Skip:
    """A received message as the gateway submits it. Dedupe keys come from the chat and the message id
    (WhatsApp ids are unique per sender; a redelivery after a reconnect carries the same one). A file
    without a ``media`` handle is described, not fetched; one with it is fetched by the kit (``parse``)."""
    if msg.from_me:
        return Skip("sent by this account")
    if not msg.id or not msg.chat:
        return Skip("a message without an id or a chat")
    if msg.chat.endswith("@broadcast") or msg.chat == "status":
        return Skip("a status update or broadcast")
    text = msg.text
    if msg.kind != "text" and not msg.media:
        what = f"{msg.kind} ({msg.file_name})" if msg.file_name else msg.kind
        note = f"[{_article(what)} {what} was sent; files are not fetched in linked-device mode]"
        text = f"{text}\n{note}" if text else note
    if not text.strip() and not (msg.media and msg.kind != "text"):
        return Skip(f"an empty {msg.kind} message")
    key = f"wa:{instance}:lm:{msg.chat}:{msg.sender}:{msg.id}" if msg.group else f"wa:{instance}:lm:{msg.chat}:{msg.id}"
    return InboundMessage(
        chat=msg.chat, sender=msg.sender or msg.chat, text=text, dedupe_keys=[key], private=not msg.group,
        addressed=msg.mentions_me or text.startswith("/"), sender_name=msg.sender_name, platform_msg_id=msg.id,
        reply_to=msg.reply_to, room=msg.chat if msg.group else "", sent_at=msg.timestamp,
    )


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


# ---------------------------------------------------------------- outbound

LOGGED_OUT_RETRY_S = 300.0   # a message waits (up to the outbox's attempts) for the number to be linked again
RATE_LIMIT_MIN_S = 5.0


def outcome(exc: SendError, attempt: int) -> Outcome:
    """A send error as the outbox records it: retried only when another try can succeed."""
    if exc.kind in (SendKind.NOT_CONNECTED, SendKind.NETWORK):
        return Retry(outbox_backoff(attempt), str(exc))
    if exc.kind is SendKind.RATE_LIMITED:
        return Retry(max(exc.retry_after_s, RATE_LIMIT_MIN_S, outbox_backoff(attempt)), str(exc))
    if exc.kind is SendKind.LOGGED_OUT:
        return Retry(LOGGED_OUT_RETRY_S, f"{exc}; link the number again with `starling whatsapp link`")
    return Failed(str(exc))  # NO_ACCOUNT, TOO_LARGE, REJECTED: another try gives the same answer


def jid_user(chat: str) -> tuple[str, str]:
    """(user, server) of a chat as the gateway names it: a number is a person, "<id>@g.us" a group."""
    if "@" in chat:
        user, _, server = chat.partition("@")
        return user, server
    return "".join(ch for ch in chat if ch.isdigit()), "s.whatsapp.net"
