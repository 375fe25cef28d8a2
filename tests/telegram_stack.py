"""A whole Starling for Telegram tests (tests/gateway_stack.py) around the fake Bot API."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tests.fake_telegram import DEFAULT_TOKEN, FakeTelegramProcess
from tests.gateway_stack import GatewayStack
from tests.procs import wait_until

OWNER = 42  # the allowed user in every stack


class Stack(GatewayStack):
    service = "gateway.telegram"

    def __init__(self, root: Path | None = None, extra: str = "", gateway: str = "", tokens=(DEFAULT_TOKEN,),
                 runners: int = 1, runner_lease_s: float = 3) -> None:
        self.tokens = list(tokens)
        super().__init__(root, extra, gateway, runners, runner_lease_s)

    @property
    def tg(self) -> FakeTelegramProcess:
        return self.fake

    def start_fake(self, root: Path, **kw) -> FakeTelegramProcess:
        return FakeTelegramProcess(root / "fake-tg", tokens=self.tokens).start()

    def gateway_config(self, gateway: str) -> tuple[str, dict[str, str]]:
        text = gateway.replace("{TG}", self.fake.url) or (
            f'[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{self.fake.url}"\nallow = [{OWNER}]\n')
        secrets = {"tg-token": self.tokens[0]}
        secrets.update({f"tg-token-{i}": t for i, t in enumerate(self.tokens[1:], start=2)})
        return text, secrets

    def replies(self, chat_id: int, count: int, timeout: float = 20.0) -> list[dict]:
        wait_until(lambda: len(self.tg.sent(chat_id=chat_id)) >= count, timeout=timeout,
                   what=f"{count} messages to chat {chat_id}")
        return self.tg.sent(chat_id=chat_id)


@contextlib.contextmanager
def stack(**kw):
    s = Stack(**kw)
    try:
        yield s
    finally:
        s.stop()
