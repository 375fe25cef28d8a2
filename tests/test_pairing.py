"""Pairing: unknown senders get one code each, at most 50 pending per instance, approval lets them in."""

from __future__ import annotations

import asyncio
import re
import time

import pytest

from common import db
from common.cli.main import main as cli
from common.errors import WriteRejected
from common.stores import access_store, schema_store
from schema import messages as m
from services.writer.apply import PAIRING_ALPHABET, PAIRING_MAX_PENDING
from tests.procs import make_home, remove_home, start_writer


def ask(home, sender: str, instance: str = "tg") -> m.Pairing:
    async def go():
        async with home.client() as c:
            return await c.call(m.RequestPairing(instance=instance, sender=sender, chat=f"chat-{sender}",
                                                 sender_name=sender.title()))

    return asyncio.run(go())


@pytest.fixture
def writer(home):
    proc = start_writer(home)
    yield home
    proc.stop()


def test_a_code_is_8_unambiguous_characters_and_asking_again_returns_it(writer):
    first, again = ask(writer, "alice"), ask(writer, "alice")
    assert ("new", "existing", first.code, True) == (
        first.status, again.status, again.code, bool(re.fullmatch(f"[{PAIRING_ALPHABET}]{{8}}", first.code)))


def test_ten_strangers_asking_again_and_again_do_not_lock_out_the_next_one(writer):
    for _round in range(3):  # each asks three times: still one code each
        answers = [ask(writer, f"stranger{i}") for i in range(10)]
    newcomer = ask(writer, "newcomer")
    conn = db.open_reader(writer.paths.db_file)
    codes = {code.sender: code.code for code in access_store.pending(conn, time.time()) if code.instance == "tg"}
    assert ({"existing"}, "new", 11) == ({a.status for a in answers}, newcomer.status, len(codes))
    assert all(codes[f"stranger{i}"] == answers[i].code for i in range(10))


def test_at_most_pairing_max_pending_codes_are_pending_per_instance(writer):
    statuses = [ask(writer, f"s{i}", instance="capped").status for i in range(PAIRING_MAX_PENDING + 1)]
    other_instance = ask(writer, "s-other", instance="other").status
    assert ({"new"}, "full", "new") == (set(statuses[:-1]), statuses[-1], other_instance)


def test_approving_a_code_lets_its_sender_in(writer, capsys):
    code = ask(writer, "bob").code
    listed = cli(["--home", str(writer.root), "pairing", "list"])
    listing = capsys.readouterr().out
    approved = cli(["--home", str(writer.root), "pairing", "approve", code.lower()])
    conn = db.open_reader(writer.paths.db_file)
    assert (0, True, 0, True) == (listed, code in listing, approved, access_store.is_allowed(conn, "tg", "bob"))
    assert "allowed" == ask(writer, "bob").status


def test_an_unknown_or_used_code_is_refused(writer):
    code = ask(writer, "carol").code

    async def approve(value):
        async with writer.client() as c:
            await c.call(m.ApprovePairing(code=value, approved_by="test"))

    asyncio.run(approve(code))
    errors = []
    for value in (code, "ZZZZZZZZ"):
        with pytest.raises(WriteRejected) as err:
            asyncio.run(approve(value))
        errors.append(err.value.code)
    assert ["conflict", "not_found"] == errors


def test_an_expired_code_frees_its_place():
    home = make_home()
    try:
        conn = db.open_writer(home.paths.db_file)
        schema_store.migrate(conn, home.paths.db_file)
        now = time.time()
        access_store.create_code(conn, "AAAAAAAA", "tg", "x", "c", "", now - 7200, 3600)
        assert (0, None, []) == (access_store.count_pending(conn, "tg", now),
                                 access_store.code_for_sender(conn, "tg", "x", now), access_store.pending(conn, now))
    finally:
        remove_home(home)
