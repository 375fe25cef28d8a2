"""A whole Starling around one gateway for end-to-end tests: a fake platform and a fake model (each a
process of its own), the writer, runners and the gateway, each started as in production. Every process
is stopped at the end, whatever happens.

Crash tests: ``kill_gateway()``, ``kill_runner(i)`` and ``kill_writer()`` kill -9 one process and start it
again as production would (the writer answering a ping, the gateway ready), returning the new Proc.
A platform's stack subclasses `GatewayStack`: it starts its fake in ``start_fake`` and returns the
gateway's config and secrets from ``gateway_config``.

For streams under crashes (tests/test_*_durability.py): ``stream_plan`` and ``Feeder`` send each
conversation's messages on a schedule from a thread of their own, ``repeats_per_kill`` says which kill
each repeated reply belongs to, ``check_sequence`` judges what one conversation got (every message answered
exactly once, in order, duplicates anywhere counted), ``log_events`` reads a service's JSON log lines."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Hashable

from common import db
from common.personas import create_pack
from common.secrets import set_secret
from common.stores import outbox_store, turn_store
from tests.fake_models import FakeModelsProcess
from tests.procs import Proc, make_home, remove_home, start_writer, wait_until


def base_config(model_url: str, runner_lease_s: float = 3) -> str:
    return (
        f"[runner]\nprocesses = 1\nlease_s = {runner_lease_s:g}\n"
        "[providers.default]\n"
        f'kind = "openai"\nbase_url = "{model_url}"\napi_key = "openai"\nmodel = "fake-model"\n'
        "context_window = 100000\n"
        "[health]\nheartbeat_interval_ms = 1000\n"
    )


class GatewayStack:
    service = ""  # e.g. "gateway.telegram"
    module = ""   # the gateway's program when not services.<service> (a test entry module passing in fakes)

    def __init__(self, root: Path | None = None, extra: str = "", gateway: str = "", runners: int = 1,
                 runner_lease_s: float = 3, **fake) -> None:
        self.fake_model = self.fake = self.writer = self.gateway = None
        self.runners: list[Proc] = []
        self.extra_procs: list[Proc] = []
        self._gateway_args: tuple[str, ...] = ()
        home = self.home = make_home("", root=root)
        try:  # a failed start stops what did start
            self.fake_model = FakeModelsProcess(home.root / "fake-model").start()
            self.fake = self.start_fake(home.root, **fake)
            gateway_text, secrets = self.gateway_config(gateway)
            extra = extra.replace("{MODEL_URL}", self.fake_model.url)  # a second provider on the same fake
            self.home = make_home(base_config(self.fake_model.openai_url, runner_lease_s) + gateway_text + extra, root=home.root)
            set_secret(self.home.paths.secrets_file, "openai", "sk-test-not-a-real-key-1234")
            for name, value in secrets.items():
                set_secret(self.home.paths.secrets_file, name, value)
            create_pack(self.home.paths, "default")
            self.writer = start_writer(self.home)
            self.runners = [Proc(self.home, "runner", "--name", f"runner-{i}") for i in range(runners)]
        except BaseException:
            self.stop()
            raise

    def start_fake(self, root: Path, **kw):
        raise NotImplementedError

    def gateway_config(self, gateway: str) -> tuple[str, dict[str, str]]:
        """(the [[gateways.x]] TOML, given or the default one, and the secrets it names)."""
        raise NotImplementedError

    def start_gateway(self, *args: str, wait_ready: bool = True) -> Proc:
        log_file = self.home.paths.logs_dir / f"{self.service}.log"
        start = log_file.stat().st_size if log_file.exists() else 0  # a restart appends to the same log
        self._gateway_args = args
        self.gateway = Proc(self.home, self.service, *args, module=self.module)
        if wait_ready:
            wait_until(lambda: '"event":"ready"' in self.gateway.log_text()[start:] or not self.gateway.alive(),
                       timeout=20, what="the gateway to be ready")
            assert self.gateway.alive(), self.gateway.log_text()[-3000:]
        return self.gateway

    def kill_gateway(self, restart: bool = True) -> Proc | None:
        """kill -9 the gateway; started again (same arguments) and ready, unless ``restart`` is False."""
        _kill(self.gateway)
        self.gateway = None
        return self.start_gateway(*self._gateway_args) if restart else None

    def kill_runner(self, index: int = 0, restart: bool = True) -> Proc | None:
        """kill -9 runner ``index``; started again under the same name unless ``restart`` is False."""
        _kill(self.runners[index])
        if not restart:
            return None
        self.runners[index] = Proc(self.home, "runner", "--name", f"runner-{index}")
        return self.runners[index]

    def kill_runner_holding_a_turn(self, index: int = 0) -> float:
        """Make the next turn take a second and kill -9 runner ``index`` while it holds it (started again);
        returns the time of the kill."""
        self.fake_model.add({"delay": 1.0})
        wait_until(self.turns_claimed, timeout=5, interval=0.01, what="the runner to hold a turn")
        killed = time.time()
        self.kill_runner(index)
        return killed

    def kill_writer(self, restart: bool = True) -> Proc | None:
        """kill -9 the writer; started again and answering a ping unless ``restart`` is False."""
        _kill(self.writer)
        self.writer = None
        if restart:
            self.writer = start_writer(self.home)
        return self.writer

    def kill_all(self, restart: bool = True) -> float:
        """kill -9 every process at once (a whole-service crash: the gateway, the runners, the writer), then
        start them again as production would, the writer first. Returns the time of the kill."""
        procs = [p for p in (self.gateway, *self.runners, self.writer) if p is not None]
        for proc in procs:
            proc.popen.send_signal(signal.SIGKILL)
        killed = time.time()
        for proc in procs:
            proc.popen.wait(10)
            proc.stop()
        self.gateway = self.writer = None
        if restart:
            self.writer = start_writer(self.home)
            self.runners = [Proc(self.home, "runner", "--name", f"runner-{i}") for i in range(len(self.runners))]
            self.start_gateway(*self._gateway_args)
        return killed

    def turns_claimed(self) -> int:
        """How many turns runners hold now."""
        conn = self.reader()
        with db.read_tx(conn):
            return turn_store.count_by_state(conn).get("claimed", 0)

    def reader(self):
        return db.open_reader(self.home.paths.db_file)

    # what the tests read back (the database through its stores, the fake model's requests)

    def user_turns(self, instance: str, chat: str | int) -> list[str]:
        """The texts a chat of an instance stored as user turns, across its sessions, oldest first."""
        conn = self.reader()
        with db.read_tx(conn):
            return [t.content for t in turn_store.user_turns_for_chat(conn, instance, str(chat))]

    def outbox(self, instance: str, chat: str | int) -> list[outbox_store.Row]:
        conn = self.reader()
        with db.read_tx(conn):
            return outbox_store.for_chat(conn, instance, str(chat))

    def settled(self, instance: str, chat: str | int, timeout: float = 10.0) -> list[outbox_store.Row]:
        """The chat's outbox once every row is sent or failed."""
        def done() -> bool:
            rows = self.outbox(instance, chat)
            return bool(rows) and all(r.state in ("sent", "failed") for r in rows)

        wait_until(done, timeout, what=f"{instance}:{chat}'s outbox to settle")
        return self.outbox(instance, chat)

    def model_saw(self, text: str) -> bool:
        """Whether any request to the fake model carried ``text``."""
        return any(text in json.dumps(r["body"], ensure_ascii=False) for r in self.fake_model.requests("openai"))

    def stop(self) -> None:
        for proc in [self.gateway, *self.extra_procs, *self.runners, self.writer]:
            if proc is not None:
                proc.stop()
        for fake in (self.fake, self.fake_model):
            if fake is not None:
                fake.stop()
        remove_home(self.home)


def _kill(proc: Proc | None) -> None:
    if proc is not None:
        proc.kill9()
        proc.stop()  # closes its log file; the process is gone already


# ---------------------------------------------------------------- streams under crashes


def log_events(text: str, event: str) -> list[dict]:
    """The JSON log lines of ``text`` whose event is ``event``."""
    found = []
    for line in text.splitlines():
        if f'"event":"{event}"' in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                pass
    return found


def stream_plan(conversations: list, schedule: list[float], spread_s: float) -> list[tuple[float, Hashable, int]]:
    """(seconds from the start, conversation, k), in time order: conversation i sends its k-th message at
    ``schedule[k] + i * spread_s / len(conversations)`` (conversations start spread, so replies do not
    come in bursts)."""
    return sorted((at + i * spread_s / len(conversations), c, k)
                  for k, at in enumerate(schedule) for i, c in enumerate(conversations))


class Feeder(threading.Thread):
    """Sends a ``stream_plan`` from a thread of its own: ``send(conversation, k)`` sends one message and returns
    its text, kept in ``sent[conversation]`` in order. ``with Feeder(...) as feed:`` starts it (and stops it
    if the block fails); ``feed.finish()`` then waits for the plan and returns what was sent."""

    def __init__(self, plan: list[tuple[float, Hashable, int]], send: Callable[[Hashable, int], str]) -> None:
        super().__init__(daemon=True)
        self.plan = plan
        self.send = send
        self.sent: dict[Hashable, list[str]] = {}
        self.error: BaseException | None = None
        self.stop = threading.Event()

    def __enter__(self) -> Feeder:
        self.start()
        return self

    def __exit__(self, exc_type, *_exc) -> None:
        if exc_type is not None:  # the test failed mid-stream: stop sending, bounded
            self.stop.set()
            self.join(timeout=30)

    def finish(self, timeout: float = 30.0) -> dict[Hashable, list[str]]:
        """Wait for the whole plan to be sent; what was sent, per conversation, in order. What the thread
        hit is raised here."""
        self.join(timeout=timeout)
        assert self.error is None, self.error
        assert not self.is_alive(), "the feeder did not finish its plan in time"
        return dict(self.sent)

    def run(self) -> None:
        start = time.monotonic()
        try:
            for at, conversation, k in self.plan:
                if self.stop.wait(max(0.0, start + at - time.monotonic())):
                    return
                self.sent.setdefault(conversation, []).append(self.send(conversation, k))
        except BaseException as exc:  # reported by the test
            self.error = exc


IN_FLIGHT_S = 0.5


def repeats_per_kill(copies: dict[str, list[float]], kills: list[tuple[str, float]]) -> dict[str, int]:
    """How many replies sent twice each kill explains: ``copies`` maps a reply to the times its copies reached
    the platform, ``kills`` is [(name, time)]; a repeat belongs to the last kill between its first two copies,
    or to "none" (a repeat no crash explains). Every kill is in the answer, with 0 when it explains none.
    A kill's time is taken here before the signal; a call the killed process had already made can reach the
    platform up to IN_FLIGHT_S after it (the fake stamps a call when it handles it), so a first copy that
    late is still the kill's."""
    per_kill = {name: 0 for name, _ in kills}
    for times in copies.values():
        if len(times) >= 2:
            first, second = sorted(times)[:2]
            between = [name for name, at in kills if first - IN_FLIGHT_S <= at <= second]
            key = between[-1] if between else "none"
            per_kill[key] = per_kill.get(key, 0) + 1
    return per_kill


# A delivery report (OutboxSent) the killed writer had taken but not committed is sent again after the
# client's timeout ([bus] request_timeout_ms, 2 s), so it may still be unrecorded this long after the new
# writer answers: a gateway killed meanwhile leaves its row to be taken again.
REPORT_HELD_S = 4.0


def first_copy_in_flight(first: float, kills: list[tuple[str, float]], writer_back: float,
                         in_flight_s: float) -> bool:
    """Whether a repeated reply's first copy (reaching the platform at ``first``) was in flight at one of
    ``kills``: it came at most ``in_flight_s`` before a kill or at most IN_FLIGHT_S after it (a call the killed
    process had made, stamped when the fake handled it), or during the writer's outage (from its kill to
    ``writer_back``), when its report waited for the new writer, and a kill came before the report could."""
    writer_killed = dict(kills)["writer"]
    held = writer_killed - in_flight_s <= first <= writer_back
    return any(-IN_FLIGHT_S <= at - first <= in_flight_s
               or (held and writer_back <= at <= writer_back + REPORT_HELD_S) for _, at in kills)


def check_sequence(what: str, messages: list[str], answers: list[str]) -> int:
    """Judge the answers one conversation got, in the order they reached the platform, against its
    messages in the order they were sent (answer i is ``echo: <message i>``): every message answered, no
    answer to nothing, and the answers' message indices never go down, so a copy that comes after a later
    message's answer (a non-adjacent duplicate) is an order violation however far apart. Returns the number
    of duplicates (copies beyond the first, adjacent ones included) for the caller to judge."""
    index = {f"echo: {t}": i for i, t in enumerate(messages)}
    unknown = [a for a in answers if a not in index]
    assert not unknown, f"{what}: answers to no message sent: {unknown[:5]}"
    got = [index[a] for a in answers]
    missing = sorted(set(range(len(messages))) - set(got))
    assert not missing, f"{what}: messages never answered: {[messages[i] for i in missing[:5]]}"
    backwards = [(p, got[p - 1], got[p]) for p in range(1, len(got)) if got[p] < got[p - 1]]
    assert not backwards, (f"{what}: answers out of order (position, previous message, this message): "
                           f"{backwards[:5]} in {got}")
    return len(got) - len(messages)
