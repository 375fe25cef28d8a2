"""A whole Starling for Telegram tests: the fake Bot API, a fake model, the writer, runners and the
Telegram gateway, each a real process started as in production. Every process is stopped at the end."""

from __future__ import annotations

import contextlib
from pathlib import Path

from common import db
from common.personas import create_pack
from common.secrets import set_secret
from tests.fake_models import FakeModelsProcess
from tests.fake_telegram import DEFAULT_TOKEN, FakeTelegramProcess
from tests.procs import Proc, make_home, remove_home, start_writer, wait_until

OWNER = 42  # the allowed user in every stack


def config(model_url: str, tg_url: str, extra: str = "", gateway: str = "") -> str:
    return (
        "[runner]\nprocesses = 1\nlease_s = 3\n"
        "[providers.default]\n"
        f'kind = "openai"\nbase_url = "{model_url}"\napi_key = "openai"\nmodel = "fake-model"\n'
        "context_window = 100000\n"
        "[health]\nheartbeat_interval_ms = 1000\n"
        + (gateway or f'[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\napi_base = "{tg_url}"\n'
                      f"allow = [{OWNER}]\n")
        + extra
    )


class Stack:
    def __init__(self, root: Path | None = None, extra: str = "", gateway: str = "", tokens=(DEFAULT_TOKEN,),
                 runners: int = 1) -> None:
        home = make_home("", root=root)
        self.fake_model = FakeModelsProcess(home.root / "fake-model").start()
        self.tg = FakeTelegramProcess(home.root / "fake-tg", tokens=list(tokens)).start()
        gateway = gateway.replace("{TG}", self.tg.url)
        self.home = make_home(config(self.fake_model.openai_url, self.tg.url, extra, gateway), root=home.root)
        set_secret(self.home.paths.secrets_file, "openai", "sk-test-not-a-real-key-1234")
        set_secret(self.home.paths.secrets_file, "tg-token", tokens[0])
        for i, token in enumerate(tokens[1:], start=2):
            set_secret(self.home.paths.secrets_file, f"tg-token-{i}", token)
        create_pack(self.home.paths, "default")
        self.writer = start_writer(self.home)
        self.runners = [Proc(self.home, "runner", "--name", f"runner-{i}") for i in range(runners)]
        self.gateway: Proc | None = None
        self.extra_procs: list[Proc] = []

    def start_gateway(self, *args: str, wait_ready: bool = True) -> Proc:
        self.gateway = Proc(self.home, "gateway_telegram", *args)
        if wait_ready:
            wait_until(lambda: '"event":"ready"' in self.gateway.log_text() or not self.gateway.alive(),
                       timeout=20, what="the gateway to be ready")
            assert self.gateway.alive(), self.gateway.log_text()[-3000:]
        return self.gateway

    def reader(self):
        return db.open_reader(self.home.paths.db_file)

    def replies(self, chat_id: int, count: int, timeout: float = 20.0) -> list[dict]:
        wait_until(lambda: len(self.tg.sent(chat_id=chat_id)) >= count, timeout=timeout,
                   what=f"{count} messages to chat {chat_id}")
        return self.tg.sent(chat_id=chat_id)

    def stop(self) -> None:
        for proc in [self.gateway, *self.extra_procs, *self.runners, self.writer]:
            if proc is not None:
                proc.stop()
        self.tg.stop()
        self.fake_model.stop()
        remove_home(self.home)


@contextlib.contextmanager
def stack(**kw):
    s = Stack(**kw)
    try:
        yield s
    finally:
        s.stop()
