"""Runner test helpers: a home with a writer, a runner and a strict fake model of either kind; chatting as a
gateway does; reading the requests the fake got in either API's shape."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

from common import db
from common.personas import create_pack
from common.secrets import set_secret
from schema import messages as m
from tests.fake_models import FakeModelsProcess
from tests.procs import Proc, make_home, remove_home, start_writer

GATEWAY = "test"
KINDS = ["openai", "anthropic"]
KEY = "sk-test-not-a-real-key-1234"


def config(model_url: str, extra: str = "", kind: str = "openai") -> str:
    return (
        "[runner]\nprocesses = 1\nlease_s = 3\n"
        "[providers.default]\n"
        f'kind = "{kind}"\nbase_url = "{model_url}"\napi_key = "openai"\nmodel = "fake-model"\ncontext_window = 100000\n'
        + extra
    )


def model_url(fake: FakeModelsProcess, kind: str) -> str:
    return fake.anthropic_url if kind == "anthropic" else fake.openai_url


def start_stack(kind: str = "openai"):
    """A home with a writer, one runner and a fake model of ``kind``; stop it with ``stop_stack``."""
    home = make_home("[runner]\nprocesses = 1\n")
    fake = FakeModelsProcess(home.root / "fake").start()
    home = make_home(config(model_url(fake, kind), kind=kind), root=home.root)
    set_secret(home.paths.secrets_file, "openai", KEY)
    create_pack(home.paths, "default")
    home.kind = kind
    home.fake = fake
    home.procs = [start_writer(home)]
    home.runner = Proc(home, "runner")
    home.procs.append(home.runner)
    return home


def stop_stack(home) -> None:
    for proc in reversed(home.procs):
        proc.stop()
    home.fake.stop()
    remove_home(home)


@contextlib.contextmanager
def own_home(edit=lambda text: text, key: bool = True, kind: str = "openai"):
    """A fresh home of its own with a fake model and the default agent; the processes a test starts
    go in ``home.procs`` and are stopped at the end, whatever happens."""
    home = make_home()
    fake = FakeModelsProcess(home.root / "fake").start()
    home = make_home(edit(config(model_url(fake, kind), kind=kind)), root=home.root)
    if key:
        set_secret(home.paths.secrets_file, "openai", KEY)
    create_pack(home.paths, "default")
    home.kind = kind
    home.fake = fake
    home.procs = []
    try:
        yield home
    finally:
        for proc in reversed(home.procs):
            proc.stop()
        fake.stop()
        remove_home(home)


def started(home, proc):
    home.procs.append(proc)
    return proc


def converse(home, chat: str, text: str, replies: int = 1, timeout: float = 20.0, agent: str = "default"):
    """Send a message as a gateway would, then claim and mark sent the chat's outbox rows."""

    async def go():
        async with home.client("gateway") as c:
            accepted = await c.call(m.Inbound(agent=agent, instance=GATEWAY, chat=chat, sender="u1", text=text,
                                              dedupe_keys=[uuid.uuid4().hex]))
            return accepted, await _collect(c, chat, replies, timeout)

    return asyncio.run(go())


def collect(home, chat: str, replies: int = 1, timeout: float = 20.0) -> list[str]:
    """The chat's next outbox rows, claimed and marked sent as a gateway would, without sending anything."""

    async def go():
        async with home.client("gateway") as c:
            return await _collect(c, chat, replies, timeout)

    return asyncio.run(go())


async def _collect(c, chat: str, replies: int, timeout: float) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while len(got) < replies and time.monotonic() < deadline:
        claim = await c.call(m.ClaimOutbox(worker="gw", instances=[GATEWAY], chats=[chat]))
        for item in claim.items:
            got.append(item.body)
            await c.call(m.OutboxSent(id=item.id, worker="gw"))
        if not claim.items:
            await asyncio.sleep(0.05)
    return got


def reader(home):
    return db.open_reader(home.paths.db_file)


# --- the requests the fake got, in either API's shape ------------------------------------------------------


def refused(requests: list[dict]) -> list[str]:
    """What the strict fake refused among these requests (as the real API would have)."""
    return [r["invalid"] for r in requests if "invalid" in r]


def tool_calls(body: dict) -> list[tuple[str, str]]:
    """(id, name) of every tool call in a request's history, oldest first."""
    out = []
    for msg in body["messages"]:
        for c in msg.get("tool_calls") or []:
            out.append((c["id"], c["function"]["name"]))
        if isinstance(msg.get("content"), list):
            out += [(b["id"], b["name"]) for b in msg["content"] if b.get("type") == "tool_use"]
    return out


def tool_results(body: dict) -> list[tuple[str, str]]:
    """(call id, content) of every tool result in a request's history, oldest first."""
    out = []
    for msg in body["messages"]:
        if msg["role"] == "tool":
            out.append((msg["tool_call_id"], msg["content"]))
        elif isinstance(msg.get("content"), list):
            out += [(b["tool_use_id"], b.get("content", "")) for b in msg["content"] if b.get("type") == "tool_result"]
    return out


def texts(body: dict) -> list[str]:
    """The system prompt and every text of a request, in order, OpenAI or Anthropic."""
    out = [body["system"]] if isinstance(body.get("system"), str) else []
    for msg in body["messages"]:
        content = msg.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [b["text"] for b in content if b.get("type") == "text"]
    return out
