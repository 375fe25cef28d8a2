"""Who may reach an agent through a gateway instance: deny by default, pairing codes for strangers.

A private chat's sender is allowed when the instance's `allow` lists them or they were paired
(`starling pairing approve CODE`, stored in sender_access). A group is answered only when its chat
id is allowed the same way (or, where the platform opts in with ``senders_in_groups``, when the
sender is); strangers in groups are ignored, never handed codes in public.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Callable

from common.db import read_tx
from common.stores import access_store
from schema import messages as m

NOTICE_EVERY_S = 600.0  # a stranger who keeps writing is reminded of their code at most this often


class Verdict(Enum):
    ALLOW = "allow"
    PAIR = "pair"      # a stranger in a private chat: hand out a pairing code, store nothing else
    IGNORE = "ignore"  # a stranger in a group, or a group nobody allowed


class Access:
    def __init__(self, instance: str, allow: list[str], reader: Callable[[], object],
                 senders_in_groups: bool = False) -> None:
        self.instance = instance
        self.senders_in_groups = senders_in_groups
        self.allow = frozenset(allow)
        self.reader = reader
        self._noticed: dict[str, float] = {}

    def _paired(self, who: str) -> bool:
        with read_tx(self.reader()) as conn:
            return access_store.is_allowed(conn, self.instance, who)

    def verdict(self, sender: str, chat: str, private: bool) -> Verdict:
        if private:
            if sender in self.allow or self._paired(sender):
                return Verdict.ALLOW
            return Verdict.PAIR
        if chat in self.allow or self._paired(chat):
            return Verdict.ALLOW
        if self.senders_in_groups and (sender in self.allow or self._paired(sender)):
            return Verdict.ALLOW
        return Verdict.IGNORE

    def notice(self, answer: m.Pairing, sender: str, now: float | None = None) -> str | None:
        """What to tell a stranger after their pairing request, or None to stay quiet (rate limit)."""
        now = time.monotonic() if now is None else now
        if answer.status == "allowed":
            return None
        if answer.status != "new" and now - self._noticed.get(sender, -NOTICE_EVERY_S) < NOTICE_EVERY_S:
            return None
        if len(self._noticed) > 10_000:
            self._noticed.clear()
        self._noticed[sender] = now
        if answer.status == "full":
            return "I can't take new pairing requests right now. Please try again in an hour."
        minutes = max(1, int((answer.expires_at - time.time()) // 60))
        return (f"Hi! I don't know you yet. Your pairing code is {answer.code} (valid for {minutes} minutes).\n"
                f"Ask my owner to run: starling pairing approve {answer.code}")
