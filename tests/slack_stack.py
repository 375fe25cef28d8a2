"""A whole Starling for Slack tests (tests/gateway_stack.py) around the fake Slack (tests/fake_slack.py)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tests.fake_slack import DEFAULT, FakeSlackProcess
from tests.gateway_stack import GatewayStack
from tests.procs import wait_until

OWNER = "U0OWNER"  # the allowed user in every stack


class SlackStack(GatewayStack):
    service = "gateway.slack"

    def __init__(self, root: Path | None = None, extra: str = "", gateway: str = "", runners: int = 1,
                 **fake) -> None:
        super().__init__(root, extra, gateway, runners, **fake)

    @property
    def sl(self) -> FakeSlackProcess:
        return self.fake

    def start_fake(self, root: Path, **kw) -> FakeSlackProcess:
        return FakeSlackProcess(root / "fake-slack", **kw).start()

    def gateway_config(self, gateway: str) -> tuple[str, dict[str, str]]:
        text = gateway.replace("{API}", self.fake.api_base) or (
            f'[[gateways.slack]]\nid = "sl"\napi_base = "{self.fake.api_base}"\nallow = ["{OWNER}"]\n'
            "ping_interval_s = 1\n")
        return text, {"slack-bot": DEFAULT["bot_token"], "slack-app": DEFAULT["app_token"],
                      "slack-signing": DEFAULT["signing_secret"]}

    def posted(self, channel: str, count: int, timeout: float = 20.0, **filters) -> list[dict]:
        wait_until(lambda: len(self.sl.records("posted", channel=channel, **filters)) >= count, timeout=timeout,
                   what=f"{count} messages posted to {channel}")
        return self.sl.records("posted", channel=channel, **filters)


@contextlib.contextmanager
def slack_stack(**kw):
    s = SlackStack(**kw)
    try:
        yield s
    finally:
        s.stop()
