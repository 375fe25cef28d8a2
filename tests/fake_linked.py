"""A fake WhatsApp Web client behind services/gateway/whatsapp/linked.LinkedClient, for tests only.

It plays the phone and WhatsApp's servers: pairing by QR or pair code, connections that fail or drop,
logouts with a reason, messages in and out. Its keys live in the session store like a real client's
(an identity at pairing, a ratchet counter saved before each message is used).

Driven in process (``FakeClient.last``, ``await client.deliver(msg)``, ``await client.drop()`` ...) or,
in another process (the gateway under test, tests/linked_gateway.py), through files under
``$STARLING_WHATSAPP_FAKE_DIR/<instance>/``: ``inbox/*.json`` messages and commands (``{"op": "message",
...}``, ``{"op": "drop"}``, ``{"op": "logout", "reason": "DEVICE_REMOVED"}``), kept until the gateway
acked a message (as WhatsApp redelivers); a message's file (``"media": handle``) in ``media/<handle>``;
sends appended to ``sent.jsonl``; ``log.jsonl`` records calls.
Passed in by tests: ``make_client=FakeClient``, or the gateway program tests/linked_gateway.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from pathlib import Path

from services.gateway.whatsapp.linked import (
    ConnectError, LinkedClient, LinkedMessage, LogoutReason, SendError, SendKind,
)

DIR_ENV = "STARLING_WHATSAPP_FAKE_DIR"
ACCOUNT = "4915199990000"
NO_ACCOUNT = "4900000000000"  # sending here fails as "not on WhatsApp"


class FakeClient(LinkedClient):
    last: FakeClient | None = None
    fail_connects = 0      # class-wide knobs for in-process tests
    pair_by = "scan"       # scan: paired after the first QR; never: keep showing QR codes
    files: dict[str, bytes] = {}  # media handle -> bytes, for download() in process

    def __init__(self, instance, store, events, log) -> None:
        super().__init__(instance, store, events, log)
        FakeClient.last = self
        self.connected = False
        self.connects = 0
        self.logged_out_remote = False
        self.sent: list[dict] = []
        self.read: list[str] = []
        self.typing_calls: list[tuple[str, bool]] = []
        self.closed = False
        self.tasks: set[asyncio.Task] = set()
        root = os.environ.get(DIR_ENV)
        self.dir = Path(root) / instance if root else None
        if self.dir is not None:
            (self.dir / "inbox").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------ the interface

    async def connect(self) -> None:
        self.connects += 1
        self._note("connect")
        if self.logged_out_remote or self.store.get("identity") is None:
            self._later(self.events.logged_out(LogoutReason.DEVICE_REMOVED))
            return
        if FakeClient.fail_connects > 0 or self._file_knob("fail_connects"):
            FakeClient.fail_connects = max(0, FakeClient.fail_connects - 1)
            raise ConnectError("fake: network unreachable")
        self._later(self._connected())
        self._start_inbox()

    async def pair(self, phone: str = "") -> None:
        self._note("pair", phone=phone)
        self._later(self._pairing(phone))

    async def logout(self) -> None:
        if not self.connected:
            raise SendError(SendKind.NOT_CONNECTED)
        self._note("logout")
        self.connected = False
        self.logged_out_remote = True

    async def send_text(self, chat: str, text: str, reply_to: str = "") -> str:
        return await self._send({"chat": chat, "text": text})

    async def send_file(self, chat: str, path: Path, caption: str = "") -> str:
        return await self._send({"chat": chat, "file": path.name, "caption": caption})

    async def download(self, media: str) -> bytes:
        """A received file's bytes: ``media/<handle>`` under the fake's folder (another process), else
        ``FakeClient.files``; a handle neither knows is an OSError, as a file gone from WhatsApp's servers."""
        self._note("download", media=media)
        if self.dir is not None:
            return (self.dir / "media" / media).read_bytes()
        if media not in FakeClient.files:
            raise FileNotFoundError(f"fake: no media {media!r}")
        return FakeClient.files[media]

    async def mark_read(self, chat: str, sender: str, ids: list[str]) -> None:
        self.read.extend(ids)

    async def typing(self, chat: str, on: bool) -> None:
        self.typing_calls.append((chat, on))

    async def close(self) -> None:
        self.closed = True
        self.connected = False
        for task in list(self.tasks):
            task.cancel()

    # ------------------------------------------------------------ playing WhatsApp

    async def deliver(self, msg: LinkedMessage) -> None:
        """A message arrives: the ratchet moves (saved first), then the owner gets it; raises if not acked."""
        self._advance()
        await self.events.message(msg)

    async def drop(self, reason: str = "fake: connection reset") -> None:
        self.connected = False
        await self.events.disconnected(reason)

    async def remote_logout(self, reason: LogoutReason) -> None:
        self.connected = False
        self.logged_out_remote = reason.session_dead
        await self.events.logged_out(reason)

    async def _connected(self) -> None:
        await asyncio.sleep(0.01)
        self.connected = True
        await self.events.connected(ACCOUNT)

    async def _pairing(self, phone: str) -> None:
        await asyncio.sleep(0.01)
        if phone:
            await self.events.pair_code("FAKE-CODE")
        else:
            await self.events.qr("2@fake-qr-ref,fake-noise-key,fake-identity,fake-adv")
            if self.pair_by == "never":
                return
        await asyncio.sleep(0.01)
        self.store.put("identity", secrets.token_bytes(32))  # saved before anyone is told it exists
        await self.events.paired(ACCOUNT)
        await self.events.disconnected("fake: 515 restart after pairing")
        await self._connected()

    async def _send(self, record: dict) -> str:
        if not self.connected:
            raise SendError(SendKind.NOT_CONNECTED)
        if record["chat"] == NO_ACCOUNT:
            raise SendError(SendKind.NO_ACCOUNT, record["chat"])
        self._advance()
        record["id"] = "3EB0" + secrets.token_hex(8).upper()
        self.sent.append(record)
        if self.dir is not None:
            with open(self.dir / "sent.jsonl", "a") as fh:
                fh.write(json.dumps(record) + "\n")
        return record["id"]

    def _advance(self) -> None:
        n = int(self.store.get("ratchet") or b"0") + 1
        self.store.put("ratchet", str(n).encode())

    # ------------------------------------------------------------ files (another process drives it)

    def _start_inbox(self) -> None:
        if self.dir is not None and not any(getattr(t, "inbox", False) for t in self.tasks):
            task = self._later(self._inbox())
            task.inbox = True

    async def _inbox(self) -> None:
        inbox = self.dir / "inbox"
        while True:
            for path in sorted(inbox.glob("*.json")):
                if not self.connected:
                    break
                cmd = json.loads(path.read_text())
                op = cmd.pop("op", "message")
                try:
                    if op == "drop":
                        path.unlink()
                        await self.drop()  # the transport's reconnect policy calls connect() again
                    elif op == "logout":
                        path.unlink()
                        await self.remote_logout(LogoutReason[cmd.get("reason", "DEVICE_REMOVED")])
                    else:
                        await self.deliver(LinkedMessage(**cmd))
                        path.unlink()  # acked: WhatsApp would not send it again
                except Exception as exc:  # not acked: it stays and comes again
                    self._note("not_acked", error=str(exc))
            await asyncio.sleep(0.05)

    def _file_knob(self, name: str) -> bool:
        if self.dir is None:
            return False
        knob = self.dir / name
        if not knob.exists():
            return False
        left = int(knob.read_text() or 0)
        if left <= 0:
            return False
        knob.write_text(str(left - 1))
        return True

    def _note(self, what: str, **kw) -> None:
        if self.dir is not None:
            with open(self.dir / "log.jsonl", "a") as fh:
                fh.write(json.dumps({"call": what, **kw}) + "\n")

    def _later(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task
