"""Dead letters: a platform event a gateway passes over because it was refused for itself (it fails
validation, or fails for a reason of its own again and again) is kept whole, never dropped.

It goes to the dead_letters table through the writer; when the writer cannot take it (its disk is full,
it is away), to ``data/dead-letters/<process>.jsonl`` (one JSON object a line, fsynced), moved into the
table at the gateway's next start. Either way: an error log line (``dead_letter``) and a message to
``[health] alert_to`` when one is set. ``starling status`` and ``starling doctor`` count both places.
When neither can take it, ``keep`` raises the writer's condition: the caller holds the event.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import TYPE_CHECKING

import msgspec

from common import holding
from common.errors import StarlingError
from common.held_files import DEAD_LETTER_SUFFIX
from common.home import make_private_dir
from schema import messages as m

if TYPE_CHECKING:
    from services.gateway.base import Gateway
    from services.gateway.channel import Channel

WRITER_WITHIN_S = 5.0   # then the event goes to the file instead
ALERT_WITHIN_S = 5.0
ALERT_EVERY_S = 300.0   # one alert message per process in this long; the log has every one
_decode_op = msgspec.json.Decoder(m.DeadLetter)
_encode = msgspec.json.Encoder()


def as_text(raw: object) -> str:
    """The event as the platform sent it, as text (JSON when it was parsed JSON)."""
    if isinstance(raw, (bytes, bytearray)):
        return bytes(raw).decode("utf-8", "replace")
    if isinstance(raw, str):
        return raw
    try:
        return json.dumps(raw, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(raw)


class DeadLetters:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.log = gateway.log
        self.folder = gateway.paths.dead_letters_dir
        self.file = self.folder / f"{gateway.svc.name}{DEAD_LETTER_SUFFIX}"
        self.kept = 0
        self._alerted_at = -ALERT_EVERY_S
        self._unalerted = 0

    async def keep(self, channel: Channel, event_key: str, raw: object, reason: str) -> None:
        op = m.DeadLetter(platform=channel.platform, instance=channel.id, event_key=event_key, reason=reason[:2000],
                          payload=as_text(raw), received_at=time.time())
        where = "table"
        try:
            key = f"dead:{channel.id}:{event_key}" if event_key else None
            await asyncio.wait_for(self.gateway.call(op, key=key), WRITER_WITHIN_S)
        except (StarlingError, asyncio.TimeoutError) as exc:
            where = "file"
            try:
                await asyncio.to_thread(self._append, op)
            except OSError as err:  # neither can take it: the caller holds the event (not dropped)
                self.log.error("dead_letter_not_kept", instance=channel.id, event_key=event_key,
                               writer_error=str(exc), file_error=err.strerror)
                raise
        self.kept += 1
        channel.log.error("dead_letter", event_key=event_key, reason=reason[:500], kept_in=where,
                          hint="the event is kept whole; see `starling status` and `starling doctor`")
        await self._alert(channel, event_key, reason)

    def _append(self, op: m.DeadLetter) -> None:
        make_private_dir(self.folder)
        fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, _encode.encode(op) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    async def _alert(self, channel: Channel, event_key: str, reason: str) -> None:
        target = self.gateway.svc.cfg.health.alert_to
        self._unalerted += 1
        now = time.monotonic()
        if not target or now - self._alerted_at < ALERT_EVERY_S:
            return
        count, self._unalerted, self._alerted_at = self._unalerted, 0, now
        instance, _, chat = target.partition(":")
        more = f" (and {count - 1} more since the last alert)" if count > 1 else ""
        text = (f"Starling passed over a {channel.platform} event on {channel.id} ({event_key or 'no id'}){more}: "
                f"{reason[:300]}. It is kept whole as a dead letter: see `starling status`.")
        try:
            await asyncio.wait_for(self.gateway.call(m.EnqueueOutbox(instance=instance, chat=chat,
                                                                     replies=[m.Reply(text=text)], alert=True)),
                                   ALERT_WITHIN_S)
        except (StarlingError, asyncio.TimeoutError) as exc:
            self.log.warning("alert_not_queued", alert_to=target, error=str(exc) or type(exc).__name__)

    async def move_file_into_table(self) -> None:
        """At start: dead letters a predecessor could only write to its file go into the table (each is
        kept once: its event key), then the file is removed. Left as it is when the writer cannot take them."""
        try:
            lines = self.file.read_bytes().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            if not line.strip():
                continue
            try:
                op = _decode_op.decode(line)
            except msgspec.DecodeError:  # a torn last line (killed mid-write): it was never confirmed
                continue
            try:
                key = f"dead:{op.instance}:{op.event_key}" if op.event_key else None
                await holding.call(self.gateway.rt.client, op, key=key, log=self.log)
            except StarlingError as exc:
                self.log.warning("dead_letters_not_moved", file=str(self.file), error=str(exc))
                return
        self.file.unlink(missing_ok=True)
        self.log.info("dead_letters_moved", file=str(self.file), count=len(lines))
