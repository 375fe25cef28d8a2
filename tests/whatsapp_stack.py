"""A whole Starling for WhatsApp tests (tests/gateway_stack.py) around the fake Graph API, which also
plays Meta's webhook sender (tests/fake_whatsapp.py)."""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from tests.fake_whatsapp import (
    DEFAULT_APP_SECRET, DEFAULT_PHONE_NUMBER_ID, DEFAULT_TOKEN, DEFAULT_VERIFY_TOKEN, FakeWhatsAppProcess,
)
from tests.gateway_stack import GatewayStack
from tests.procs import wait_until

OWNER = "4915112345678"  # the allowed number in every stack


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WhatsAppStack(GatewayStack):
    service = "gateway.whatsapp"

    def __init__(self, root: Path | None = None, extra: str = "", gateway: str = "", runners: int = 1) -> None:
        self.port = free_port()
        self.webhook = f"http://127.0.0.1:{self.port}/whatsapp/wa/webhook"
        super().__init__(root, extra, gateway, runners)

    @property
    def wa(self) -> FakeWhatsAppProcess:
        return self.fake

    def start_fake(self, root: Path, **kw) -> FakeWhatsAppProcess:
        return FakeWhatsAppProcess(root / "fake-wa", webhook=self.webhook, app_secret=DEFAULT_APP_SECRET).start()

    def gateway_config(self, gateway: str) -> tuple[str, dict[str, str]]:
        text = gateway.replace("{API}", self.fake.api_base).replace("{LISTEN}", f"127.0.0.1:{self.port}") or (
            f'[[gateways.whatsapp]]\nid = "wa"\nphone_number_id = "{DEFAULT_PHONE_NUMBER_ID}"\n'
            f'api_base = "{self.fake.api_base}"\nlisten = "127.0.0.1:{self.port}"\nallow = ["+{OWNER}"]\n')
        return text, {"whatsapp-token": DEFAULT_TOKEN, "whatsapp-app-secret": DEFAULT_APP_SECRET,
                      "whatsapp-verify": DEFAULT_VERIFY_TOKEN}

    def replies(self, to: str, count: int, timeout: float = 20.0, **filters) -> list[dict]:
        wait_until(lambda: len(self.wa.sent(to=to, **filters)) >= count, timeout=timeout,
                   what=f"{count} messages to {to}")
        return self.wa.sent(to=to, **filters)


@contextlib.contextmanager
def whatsapp_stack(**kw):
    s = WhatsAppStack(**kw)
    try:
        yield s
    finally:
        s.stop()
