"""The bus: framing and authentication of wire messages, the writer client and the event subscriber.

Frames (every part after the ZeroMQ routing identity):
- request / ack: ``[mac, payload]``
- event:         ``[topic, mac, payload]``
``payload`` is msgpack of a ``schema.messages`` struct; ``mac`` is the first 16 bytes of
HMAC-SHA256 over ``topic + b"\\0" + payload`` (topic empty for requests and acks) with a key
derived from the session secret, so only Starling's own processes are heard. A frame that fails
the MAC or does not decode is counted, logged and dropped by whoever receives it: ``decode``
turns every failure a payload can cause (bad msgpack, a wrong shape, nesting too deep for the
decoder's recursion limit, memory) into a BadFrame, and ``Drops`` counts and logs them. No frame
larger than MAX_FRAME_BYTES is read off any socket (ZMQ_MAXMSGSIZE: libzmq drops the connection
at the frame's header, before allocating it).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio

from common.errors import BusTimeout, ConfigError, WriteRejected
from common.log import get_logger
from schema import messages as m

MAC_BYTES = 16
_NOBLOCK = int(zmq.NOBLOCK)  # plain ints: pyzmq's flag enums cost microseconds per send
LINGER_MS = 500
IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin
# The largest frame any socket reads. Attachments travel as file paths, tool results over 16 KB go
# to files, and a model's answer is capped at 16 MB by the providers (MAX_RESPONSE_BYTES); a turn
# holding one (its tool calls' arguments JSON-escaped into meta) stays well under 32 MB.
MAX_FRAME_BYTES = 32 * 1024 * 1024
LOG_FIRST_DROPS = 10  # per reason, then one line in LOG_EVERY_DROPS
LOG_EVERY_DROPS = 100
_ERROR_SHOWN = 300  # characters of a decode error kept (a deep path can make it long)

_encoder = msgspec.msgpack.Encoder()
encode = _encoder.encode
request_decoder = msgspec.msgpack.Decoder(m.RequestFrame)
ack_decoder = msgspec.msgpack.Decoder(m.AckFrame)
event_decoder = msgspec.msgpack.Decoder(m.AnyEvent)
result_decoder = msgspec.msgpack.Decoder(m.Result)


# Requests per frame a client sends at most (its callers' requests of one event-loop turn).
REQUESTS_PER_FRAME = 256


class _RequestsOut(msgspec.Struct, tag="Requests", frozen=True, kw_only=True):
    """``m.Requests`` as a client encodes it: of requests already encoded (each is kept as it was
    encoded, to be resent alone), so none is encoded twice."""

    requests: list[msgspec.Raw]


class BadFrame(Exception):
    """A payload that did not decode: ``reason`` is invalid (well-formed, wrong shape), undecodable,
    too_deep or too_large."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(error)
        self.reason = reason
        self.error = error


def decode(decoder: msgspec.msgpack.Decoder, payload: bytes):
    """``decoder.decode(payload)``; any failure, whatever the bytes, is a BadFrame."""
    try:
        return decoder.decode(payload)
    except msgspec.ValidationError as exc:
        raise BadFrame("invalid", str(exc)[:_ERROR_SHOWN]) from None
    except msgspec.DecodeError as exc:
        raise BadFrame("undecodable", str(exc)[:_ERROR_SHOWN]) from None
    except RecursionError:
        raise BadFrame("too_deep", "nested deeper than the decoder's recursion limit") from None
    except MemoryError:
        raise BadFrame("too_large", "out of memory while decoding") from None
    except Exception as exc:  # whatever else a decoder may raise, a frame is never fatal
        raise BadFrame("undecodable", f"{type(exc).__name__}: {exc}"[:_ERROR_SHOWN]) from None


class Drops:
    """Frames one receiver dropped, counted per reason, logged for the first LOG_FIRST_DROPS of a
    reason and then once in LOG_EVERY_DROPS, so a flood cannot flood the log too."""

    def __init__(self, log=None, **bind: object) -> None:
        self.counts: Counter[str] = Counter()
        self._log = log if log is not None else get_logger(**bind)

    def __call__(self, reason: str, **detail: object) -> int:
        self.counts[reason] += 1
        count = self.counts[reason]
        if count <= LOG_FIRST_DROPS or count % LOG_EVERY_DROPS == 0:
            self._log.warning("frame_dropped", reason=reason, count=count, **detail)
        return count

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def bus_key(session_secret: bytes) -> bytes:
    """The frame-signing key, derived from the session secret: HKDF-SHA256 (RFC 5869), one block.

    Written with hmac rather than imported from cryptography: every process needs it, and loading
    cryptography's OpenSSL bindings costs each of them about 5 MB of RSS.
    """
    prk = hmac.digest(b"\0" * 32, session_secret, "sha256")  # extract, with the RFC's default salt
    return hmac.digest(prk, b"starling bus v1" + b"\x01", "sha256")  # expand: T(1) is 32 bytes


def mac(key: bytes, payload: bytes, topic: bytes = b"") -> bytes:
    """One frame's tag (for one-off use; long-lived sockets keep a Signer)."""
    return Signer(key).mac(payload, topic)


def verify(key: bytes, tag: bytes, payload: bytes, topic: bytes = b"") -> bool:
    return Signer(key).verify(tag, payload, topic)


class Signer:
    """``mac``/``verify`` for one key, reusing the keyed HMAC state (about twice as fast per frame)."""

    def __init__(self, key: bytes) -> None:
        self._base = hmac.new(key, b"", hashlib.sha256)

    def mac(self, payload: bytes, topic: bytes = b"") -> bytes:
        h = self._base.copy()
        h.update(topic + b"\0" + payload if topic else b"\0" + payload)
        return h.digest()[:MAC_BYTES]

    def verify(self, tag: bytes, payload: bytes, topic: bytes = b"") -> bool:
        return hmac.compare_digest(tag, self.mac(payload, topic))


@dataclass(frozen=True)
class Endpoints:
    writer: str
    events: str


def endpoints(run_dir: Path, writer: str = "", events: str = "") -> Endpoints:
    """The bus addresses: ``ipc://`` sockets in ``run_dir`` unless the config names others."""
    chosen = Endpoints(writer or f"ipc://{run_dir}/writer.sock", events or f"ipc://{run_dir}/events.sock")
    for key, value in (("bus.writer_endpoint", chosen.writer), ("bus.events_endpoint", chosen.events)):
        check_endpoint(key, value)
    return chosen


def check_endpoint(key: str, value: str) -> None:
    if value.startswith("ipc://"):
        if len(value) - len("ipc://") > IPC_PATH_MAX:
            raise ConfigError(
                "config.toml", key, f"the socket path {value!r} is too long for a unix socket;"
                " use a shorter home or data_dir"
            )
        return
    if value.startswith("tcp://127.0.0.1:") or value.startswith("tcp://localhost:"):
        return
    raise ConfigError(
        "config.toml", key, f"expected ipc://PATH or tcp://127.0.0.1:PORT, not {value!r}"
        " (tcp to other hosts needs CURVE, which is not built yet)"
    )


def limit(sock: zmq.Socket) -> None:
    """The frame-size bound every Starling socket gets, whatever its type."""
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)


def tune(sock: zmq.Socket, heartbeat_ms: int = 1000) -> None:
    """Options every Starling request/ack socket gets: bounded frames, bounded linger, ZMTP heartbeats."""
    limit(sock)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ms * 3)
    sock.setsockopt(zmq.HEARTBEAT_TTL, heartbeat_ms * 3)


# ---------------------------------------------------------------- writer client


@dataclass
class _Pending:
    future: asyncio.Future
    payload: bytes  # the encoded Request
    resend_at: float
    deadline: float
    sends: int = 0  # times it went out on the socket (alone or in a Requests frame)
    frames: list[bytes] | None = None  # [mac, payload], made when it is first sent alone


@dataclass
class ClientStats:
    sent: int = 0
    resent: int = 0
    acked: int = 0
    late_acks: int = 0
    dropped_frames: int = 0
    timeouts: int = 0


class WriterClient:
    """Sends write requests to the writer and awaits their acks (which come after commit).

    Each request carries an id (to match its ack) and an idempotency key (caller-given, else
    unique per request), so a resend after ``timeout_s`` is safe. At most ``window`` requests are
    in flight; ``call`` waits for room. A request that no ack answers by ``deadline_s`` raises
    BusTimeout: nothing is assumed committed. The requests made in one turn of the event loop go
    out together, in one ``Requests`` frame (one send, one MAC, one receive at the writer, in the
    same group commit); a resend goes alone.
    """

    def __init__(
        self,
        endpoint: str,
        key: bytes,
        *,
        name: str,
        timeout_s: float = 2.0,
        window: int = 256,
        deadline_s: float = 60.0,
        heartbeat_ms: int = 1000,
        ctx: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.stats = ClientStats()
        self.drops = Drops(component="bus", receiver=name)
        self._signer = Signer(key)
        self._prefix = f"{name}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._ids = itertools.count(1)
        self._timeout_s = timeout_s
        self._deadline_s = deadline_s
        self._heartbeat_ms = heartbeat_ms
        self._window = asyncio.Semaphore(window)
        self._pending: dict[int, _Pending] = {}
        self._queued: list[_Pending] = []  # made in this turn of the event loop, sent by _flush at its end
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._sock: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> WriterClient:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start(self) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        tune(sock, self._heartbeat_ms)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.connect(self.endpoint)
        self._sock = sock
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._resend())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._tasks = []
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(BusTimeout("the writer client was closed"))
        self._pending.clear()
        if self._sock is not None:
            self._sock.close(linger=LINGER_MS)
            self._sock = None

    def new_key(self) -> str:
        """A unique idempotency key, for callers that must keep a key across their own retries."""
        return f"{self._prefix}:k{next(self._ids)}"

    async def call(self, op: m.WriteOp, *, key: str | None = None) -> m.Result | None:
        """Send one write and return its result once committed; WriteRejected on an error ack."""
        async with self._window:
            request_id = next(self._ids)
            payload = encode(m.Request(id=request_id, key=key or f"{self._prefix}:{request_id}", op=op))
            if len(payload) > MAX_FRAME_BYTES:  # the writer would cut the connection; fail now, not at the deadline
                raise WriteRejected("too_large", f"{type(op).__name__} is {len(payload)} bytes encoded;"
                                    f" the bus carries at most {MAX_FRAME_BYTES}")
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            deadline = time.monotonic() + self._deadline_s
            pending = _Pending(future, payload, deadline, deadline)  # not resent before _flush sent it
            self._pending[request_id] = pending
            if not self._queued:
                loop.call_soon(self._flush)
            self._queued.append(pending)
            self.stats.sent += 1
            try:
                ack: m.Ack = await future
            finally:
                self._pending.pop(request_id, None)
        if not ack.ok:
            raise WriteRejected(ack.code, ack.error)
        return ack.result

    async def call_many(self, ops: list[m.WriteOp]) -> list[m.Result | None | WriteRejected | BusTimeout]:
        """Send several writes at once: in order, in one frame (several when the window or the frame
        limit is reached), so the writer applies them in order and, up to its batch_max, in one
        commit. Returns each one's result, or the WriteRejected or BusTimeout it met, in order."""
        return await asyncio.gather(*(self.call(op) for op in ops), return_exceptions=True)

    async def ping(self, timeout_s: float = 10.0) -> bool:
        """True once the writer answers; False if it did not within ``timeout_s``."""
        try:
            await asyncio.wait_for(self.call(m.Ping()), timeout_s)
            return True
        except (asyncio.TimeoutError, BusTimeout):
            return False

    def send_hint(self, op: m.ShowDraft) -> bool:
        """Fire and forget: one frame now, never acked, never resent (a streaming draft, which the writer only
        relays). False when it could not go out (no writer connected, its queue full, too large): it is lost,
        which loses nothing."""
        if self._sock is None:
            return False
        payload = encode(op)
        if len(payload) > MAX_FRAME_BYTES:
            return False
        return self._send([self._signer.mac(payload), payload])

    def _flush(self) -> None:
        """Send the requests made in this turn of the event loop: one alone as a Request, more in
        Requests frames (at most REQUESTS_PER_FRAME each, and under the frame limit)."""
        queued = [p for p in self._queued if not p.future.done()]
        self._queued = []
        if self._sock is None:
            return
        for chunk in _frame_chunks(queued):
            if len(chunk) == 1:
                frames = self._frames(chunk[0])
            else:
                payload = encode(_RequestsOut(requests=[msgspec.Raw(p.payload) for p in chunk]))
                frames = [self._signer.mac(payload), payload]
            sent = self._send(frames)
            # an unsent request (no connection yet) is retried on the next tick, not after a timeout
            resend_at = time.monotonic() + (self._timeout_s if sent else 0.0)
            for pending in chunk:
                pending.sends += sent
                pending.resend_at = resend_at

    def _frames(self, pending: _Pending) -> list[bytes]:
        if pending.frames is None:
            pending.frames = [self._signer.mac(pending.payload), pending.payload]
        return pending.frames

    def _send(self, frames: list[bytes]) -> bool:
        # zmq.asyncio answers a non-blocking send with a future that is already settled. (Sending
        # through a plain shadow of the socket is cheaper but eats the edge-triggered wake-ups the
        # asyncio receive side depends on, and acks stall.)
        sent = self._sock.send_multipart(frames, flags=_NOBLOCK)
        if sent.done() and sent.exception() is not None:
            # no writer connected (IMMEDIATE) or its queue is full: the resend loop retries
            return False
        return True

    async def _receive(self) -> None:
        sock = self._sock
        while True:
            frames = await sock.recv_multipart()
            if len(frames) != 2 or not self._signer.verify(frames[0], frames[1]):
                self.stats.dropped_frames += 1
                self.drops("malformed" if len(frames) != 2 else "unauthenticated", parts=len(frames))
                continue
            try:
                frame = decode(ack_decoder, frames[1])
            except BadFrame as exc:
                self.stats.dropped_frames += 1
                self.drops(exc.reason, error=exc.error, size=len(frames[1]))
                continue
            for ack in frame.acks if isinstance(frame, m.Acks) else (frame,):
                pending = self._pending.get(ack.id)
                if pending is None or pending.future.done():
                    self.stats.late_acks += 1
                    continue
                self.stats.acked += 1
                pending.future.set_result(ack)

    async def _resend(self) -> None:
        tick = min(max(self._timeout_s / 4, 0.005), 0.02)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for pending in list(self._pending.values()):
                if pending.future.done():
                    continue
                if now >= pending.deadline:
                    self.stats.timeouts += 1
                    pending.future.set_exception(
                        BusTimeout(f"no ack from the writer at {self.endpoint} in {self._deadline_s:.0f}s")
                    )
                elif now >= pending.resend_at and self._send(self._frames(pending)):
                    self.stats.resent += pending.sends > 0
                    pending.sends += 1
                    pending.resend_at = now + self._timeout_s * min(2 ** (pending.sends - 1), 8)


def _frame_chunks(queued: list[_Pending]) -> list[list[_Pending]]:
    """``queued`` in order, cut into frames of at most REQUESTS_PER_FRAME requests under MAX_FRAME_BYTES."""
    chunks: list[list[_Pending]] = []
    size = 0
    for pending in queued:
        grown = size + len(pending.payload)
        if not chunks or len(chunks[-1]) >= REQUESTS_PER_FRAME or grown > MAX_FRAME_BYTES - 64:  # 64: the header
            chunks.append([])
            grown = len(pending.payload)
        chunks[-1].append(pending)
        size = grown
    return chunks


# ---------------------------------------------------------------- event subscriber


@dataclass(frozen=True)
class Resync:
    """Re-read what is pending from SQLite: events may have been missed."""

    reason: str


@dataclass
class SubscriberStats:
    events: int = 0
    resyncs: int = 0
    dropped_frames: int = 0


@dataclass
class _Sequence:
    epoch: str = ""
    seqs: dict[str, int] = field(default_factory=dict)


class EventSubscriber:
    """Receives the writer's events on some topics and says when to re-read from SQLite.

    ``next()`` returns an event, a Resync (first contact, writer restarted, a sequence gap, or no
    beat for ``beat_timeout_s``, after which the socket is replaced), or None on timeout. Events are
    hints: a consumer re-reads its pending work on every Resync and on its own poll timer.
    """

    def __init__(
        self,
        endpoint: str,
        key: bytes,
        topics: list[str],
        *,
        beat_timeout_s: float = 5.0,
        ctx: zmq.asyncio.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.stats = SubscriberStats()
        self.drops = Drops(component="bus", receiver="events")
        self._signer = Signer(key)
        self._topics = list(topics)
        self._beat_timeout_s = beat_timeout_s
        self._ctx = ctx or zmq.asyncio.Context.instance()
        self._sock: zmq.asyncio.Socket | None = None
        self._state = _Sequence()
        self._last_heard = time.monotonic()

    def start(self) -> None:
        sock = self._ctx.socket(zmq.SUB)
        # no ZMTP heartbeats here: libzmq 4.3 can abort when a slow subscriber's heartbeat times out
        # (zeromq/libzmq#3937); the writer's beat on the event topic tells liveness instead
        limit(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        for topic in [*self._topics, m.TOPIC_BEAT]:
            sock.setsockopt(zmq.SUBSCRIBE, topic.encode())
        sock.connect(self.endpoint)
        self._sock = sock
        self._state = _Sequence()
        self._last_heard = time.monotonic()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for something, then take everything queued. True when anything
        came (events or a resync): callers that re-read their work anyway need no more than that."""
        first = await self.next(timeout_s)
        if first is None:
            return False
        while await self.next(0) is not None:
            pass
        return True

    async def next(self, timeout_s: float) -> m.AnyEvent | Resync | None:
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if time.monotonic() - self._last_heard > self._beat_timeout_s:
                self.close()
                self.start()
                return self._resync(f"no beat from the writer in {self._beat_timeout_s:.0f}s")
            wait_ms = int(min(remaining, self._beat_timeout_s) * 1000) + 1 if remaining > 0 else 0
            if not await self._sock.poll(wait_ms, zmq.POLLIN):
                if remaining <= 0:
                    return None
                continue
            frames = await self._sock.recv_multipart()
            outcome = self._accept(frames)
            if outcome is not None:
                return outcome

    def _resync(self, reason: str) -> Resync:
        self.stats.resyncs += 1
        return Resync(reason)

    def _accept(self, frames: list[bytes]) -> m.AnyEvent | Resync | None:
        if len(frames) != 3 or not self._signer.verify(frames[1], frames[2], frames[0]):
            self.stats.dropped_frames += 1
            self.drops("malformed" if len(frames) != 3 else "unauthenticated", parts=len(frames))
            return None
        try:
            event = decode(event_decoder, frames[2])
            topic = frames[0].decode()
        except (BadFrame, UnicodeDecodeError) as exc:
            self.stats.dropped_frames += 1
            reason, error = (exc.reason, exc.error) if isinstance(exc, BadFrame) else ("undecodable", "topic not UTF-8")
            self.drops(reason, error=error, size=len(frames[2]))
            return None
        self._last_heard = time.monotonic()
        if isinstance(event, m.AnswerDraft):  # a hint outside the sequence: a lost one is never a reason to re-read
            self.stats.events += 1
            return event
        state = self._state
        if event.epoch != state.epoch:
            first = not state.epoch
            self._state = _Sequence(event.epoch, self._baseline(event, topic))
            return self._resync("first contact with the writer" if first else "the writer restarted")
        if isinstance(event, m.WriterBeat):
            for topic in self._topics:
                if event.seqs.get(topic, 0) > state.seqs.get(topic, 0):
                    state.seqs.update({t: event.seqs.get(t, 0) for t in self._topics})
                    return self._resync(f"missed events on {topic}")
            return None
        expected = state.seqs.get(topic, 0) + 1
        state.seqs[topic] = event.seq
        self.stats.events += 1
        if event.seq != expected:
            return self._resync(f"sequence gap on {topic}: expected {expected}, got {event.seq}")
        return event

    def _baseline(self, event: m.AnyEvent, topic: str) -> dict[str, int]:
        if isinstance(event, m.WriterBeat):
            return {t: event.seqs.get(t, 0) for t in self._topics}
        return {topic: event.seq}
