"""The "typing…" sign while an agent works on a chat's turn: renewed every few seconds until the turn
is over (answered, failed, or parked for an approval), and never for longer than MAX_S."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from common.db import read_tx
from common.stores import turn_store

if TYPE_CHECKING:
    from services.gateway.base import Gateway
    from services.gateway.channel import Channel

EVERY_S = 4.0   # Telegram shows a chat action for 5 s; Slack and WhatsApp for longer
FIRST_AFTER_S = 1.0  # a quick answer needs no sign: the first one goes after this
MAX_S = 600.0
WORKING = ("pending", "claimed")


class Typing:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._turns: dict[tuple[str, str], tuple[int, str]] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task] = {}

    def watch(self, channel: Channel, chat: str, turn_id: int, platform_msg_id: str = "") -> None:
        key = (channel.id, chat)
        self._turns[key] = (turn_id, platform_msg_id)  # a newer message in the chat: follow its turn
        if key not in self._tasks:
            self._tasks[key] = asyncio.create_task(self._loop(channel, chat, key))

    def replying_to(self, instance: str, chat: str) -> str:
        """The message the chat's working turn answers ("" when none is watched)."""
        return self._turns.get((instance, chat), (0, ""))[1]

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._tasks.clear()

    def _working(self, turn_id: int) -> bool:
        with read_tx(self.gateway.reader) as conn:
            turn = turn_store.get(conn, turn_id)
        return turn is not None and turn.state in WORKING

    async def _loop(self, channel: Channel, chat: str, key: tuple[str, str]) -> None:
        deadline = time.monotonic() + MAX_S
        shown: list[str] = []
        try:
            await asyncio.sleep(FIRST_AFTER_S)
            while time.monotonic() < deadline and self._working(self._turns[key][0]):
                msg_id = self._turns[key][1]
                if msg_id not in shown:
                    shown.append(msg_id)
                try:
                    await channel.typing(chat, msg_id)
                except Exception as exc:  # a sign is best effort: never let it fail a chat
                    channel.log.debug("typing_failed", chat=chat, error=str(exc))
                await asyncio.sleep(EVERY_S)
        finally:
            self._tasks.pop(key, None)
            self._turns.pop(key, None)
            for msg_id in shown:
                try:
                    await channel.typing_done(chat, msg_id)
                except Exception as exc:
                    channel.log.debug("typing_done_failed", chat=chat, error=str(exc))
