"""Dead letters (services/gateway/dead_letters.py, Gateway.submit): only an event refused for itself is passed
over, and then kept whole, in the dead_letters table or, while the writer cannot take it, in a file moved
into the table later; with an alert, and counted by `starling status` and `starling doctor`. The writer's
condition (disk_full) is held, however long, never a dead letter."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace

from common import db, holding
from common.cli import held
from common.cli.doctor_cmd import WARN, check_held
from common.errors import WriteRejected
from common.stores import dead_letter_store, outbox_store
from schema import messages as m
from services.gateway import base
from services.gateway import dead_letters as dl
from services.gateway.access import Verdict
from services.gateway.channel import InboundMessage
from tests.procs import REPO, make_home, remove_home, start_writer

CONFIG = ('[[gateways.telegram]]\nid = "tg"\ntoken = "tg-token"\n'
          '[health]\nalert_to = "tg:42"\n')


class Log:
    def __init__(self) -> None:
        self.events: list[str] = []

    def _add(self, event, **kw):
        self.events.append(event)

    info = warning = error = debug = _add

    def bind(self, **kw):
        return self


class Kept:
    def __init__(self) -> None:
        self.kept: list[tuple[str, object, str]] = []

    async def keep(self, channel, event_key, raw, reason) -> None:
        self.kept.append((event_key, raw, reason))


def gateway_answering(*answers) -> tuple[base.Gateway, Kept, list]:
    """A Gateway whose writer answers ``answers`` in turn (an exception is raised), everyone allowed."""
    gw = base.Gateway.__new__(base.Gateway)
    gw.access = {"tg": SimpleNamespace(verdict=lambda *a: Verdict.ALLOW)}
    gw.dead_letters = Kept()
    gw.typing = SimpleNamespace(watch=lambda *a: None)
    calls: list = []

    async def call(op, key=None):
        answer = answers[min(len(calls), len(answers) - 1)]
        calls.append(key)
        if isinstance(answer, Exception):
            raise answer
        return answer

    gw.call = call
    return gw, gw.dead_letters, calls


CHANNEL = SimpleNamespace(id="tg", agent="default", log=Log(), cfg=SimpleNamespace(groups="mention"))


def message() -> InboundMessage:
    return InboundMessage(chat="7", sender="7", text="hello", dedupe_keys=["tg:tg:m:7:1"])


def test_an_event_refused_for_itself_is_kept_whole_and_passed_over():
    gw, kept, calls = gateway_answering(WriteRejected("invalid", "text must be a string"))
    raw = {"update_id": 5, "message": {"text": "hello"}}
    assert asyncio.run(gw.submit(CHANNEL, message(), raw=raw)) == "dead_letter"
    assert len(calls) == 1  # refused: not tried again
    assert kept.kept == [("tg:tg:m:7:1", raw, "WriteRejected: invalid: text must be a string")]


def test_the_writers_condition_is_held_past_any_count_and_never_a_dead_letter(monkeypatch):
    monkeypatch.setattr(holding, "FIRST_S", 0.001)
    monkeypatch.setattr(holding, "MAX_S", 0.001)
    full = WriteRejected("disk_full", "the data disk is full")
    answers = [full] * 3 * base.SUBMIT_TRIES + [m.Accepted(turn_id=1, session_id=1)]
    gw, kept, calls = gateway_answering(*answers)
    assert asyncio.run(gw.submit(CHANNEL, message())) == "accepted"
    assert kept.kept == [] and len(calls) == len(answers) and set(calls) == {"tg:tg:m:7:1"}


def test_a_bug_on_one_event_is_tried_five_times_then_kept(monkeypatch):
    monkeypatch.setattr(holding, "FIRST_S", 0.001)
    monkeypatch.setattr(holding, "MAX_S", 0.001)
    gw, kept, calls = gateway_answering(WriteRejected("internal", "ValueError: a bug"))
    assert asyncio.run(gw.submit(CHANNEL, message())) == "dead_letter"
    assert len(calls) == base.SUBMIT_TRIES and len(kept.kept) == 1
    assert kept.kept[0][1]["text"] == "hello"  # no raw event given: the message itself, whole


def test_dead_letters_go_to_the_table_or_a_file_and_show_in_status_and_doctor(monkeypatch):
    monkeypatch.setattr(dl, "WRITER_WITHIN_S", 0.5)
    home = make_home(CONFIG)
    writer = start_writer(home)
    try:
        async def keep(*events: tuple[dict, str]) -> list[str]:
            async with home.client("gateway-telegram", timeout_s=0.1, deadline_s=30) as client:
                log = Log()
                gateway = SimpleNamespace(log=log, paths=home.paths, svc=SimpleNamespace(name="gateway-telegram",
                                          cfg=home.cfg), rt=SimpleNamespace(client=client),
                                          call=lambda op, key=None: client.call(op, key=key))
                channel = SimpleNamespace(platform="telegram", id="tg", log=log)
                letters = dl.DeadLetters(gateway)
                for raw, key in events:
                    await letters.keep(channel, key, raw, "WriteRejected: invalid: no")
                return log.events

        first = asyncio.run(keep(({"update_id": 1}, "tg:tg:u:1"), ({"update_id": 1}, "tg:tg:u:1")))
        assert first.count("dead_letter") == 2  # kept again (below: still one row)
        conn = db.open_reader(home.paths.db_file)
        with db.read_tx(conn):
            rows = dead_letter_store.latest(conn)
            alerts = outbox_store.for_chat(conn, "tg", "42")
        assert [(r.event_key, json.loads(r.payload)) for r in rows] == [("tg:tg:u:1", {"update_id": 1})]
        assert len(alerts) == 1 and "dead letter" in alerts[0].body  # one alert (then one per 5 minutes)

        writer.stop()  # the writer away: the next one goes to the file, fsynced
        events = asyncio.run(keep(({"update_id": 2}, "tg:tg:u:2")))
        assert "dead_letter" in events
        found = held.read(home.paths)
        assert (found.dead_letters, found.dead_letter_files) == (1, 1)
        checks = {c.name: c for c in check_held(home.cfg, home.paths)}
        assert checks["dead letters"].status == WARN and "2 events" in checks["dead letters"].reason
        spooled = home.paths.spool_dir / "gateway-slack.spool"  # and a gateway's spool, one event not yet stored
        spooled.parent.mkdir(mode=0o700)
        spooled.write_text('{"seq":1,"instance":"sl","key":"k","event":{"kind":"events_api","payload":{}},"at":0}\n')
        shown = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home.root), "status", "--json"],
                               capture_output=True, text=True, cwd=REPO, timeout=60)
        report = json.loads(shown.stdout)
        assert report["dead_letters"] == {"table": 1, "files": 1}, shown.stderr
        assert report["spools"] == {"gateway-slack": {"events": 1, "bytes": spooled.stat().st_size}}
        text = subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home.root), "status"],
                              capture_output=True, text=True, cwd=REPO, timeout=60).stdout
        assert "dead letters: 2 events passed over" in text and "spool gateway-slack: 1 events" in text

        writer = start_writer(home)

        async def move() -> None:
            async with home.client("gateway-telegram", timeout_s=0.1, deadline_s=30) as client:
                gateway = SimpleNamespace(log=Log(), paths=home.paths, svc=SimpleNamespace(
                    name="gateway-telegram", cfg=home.cfg), rt=SimpleNamespace(client=client))
                await dl.DeadLetters(gateway).move_file_into_table()

        asyncio.run(move())
        with db.read_tx(conn):
            assert sorted(r.event_key for r in dead_letter_store.latest(conn)) == ["tg:tg:u:1", "tg:tg:u:2"]
        conn.close()
        assert held.read(home.paths).dead_letter_files == 0
    finally:
        writer.stop()
        remove_home(home)
