"""`starling dashboard user add|list|rm|passwd` against a real writer: the password from stdin, the rules'
messages with exit 2, the writer's refusals with exit 1, sessions ended by a new password, all audited."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from common import dashboard_accounts as accounts
from common import db
from common.stores import dashboard_store
from tests.procs import REPO, make_home, remove_home, start_writer


@pytest.fixture(scope="module")
def home():
    h = make_home()
    writer = start_writer(h)
    yield h
    writer.stop()
    remove_home(h)


def cli(home, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "common.cli", "--home", str(home.root), "dashboard", "user", *args],
                          input=stdin, cwd=REPO, capture_output=True, text=True, timeout=60)


def reader(home):
    return db.open_reader(home.paths.db_file)


def test_add_list_passwd_rm(home):
    added = cli(home, "add", "olga", "--role", "viewer", stdin="a long enough password\n")
    assert 0 == added.returncode and "Added dashboard account 'olga' (viewer)" in added.stdout
    listing = json.loads(cli(home, "list", "--json").stdout)
    assert [("olga", "viewer")] == [(r["name"], r["role"]) for r in listing]
    conn = reader(home)
    with db.read_tx(conn):
        first = dashboard_store.account(conn, "olga").password_hash
    conn.close()
    assert accounts.verify_password(first, "a long enough password") and "a long enough" not in first
    changed = cli(home, "passwd", "olga", stdin="another long password\n")
    assert 0 == changed.returncode and "its sessions have ended" in changed.stdout
    conn = reader(home)
    with db.read_tx(conn):
        second = dashboard_store.account(conn, "olga").password_hash
        audit = [(r.actor.startswith("cli:"), r.action, r.target) for r in dashboard_store.recent_audit(conn)]
    conn.close()
    assert accounts.verify_password(second, "another long password")
    removed = cli(home, "rm", "olga")
    assert 0 == removed.returncode and "No dashboard accounts" in cli(home, "list").stdout
    assert (True, "dashboard.account_added", "olga") in audit and (True, "dashboard.password_changed", "olga") in audit


def test_bad_input_is_a_usage_error_and_a_refusal_a_failure(home):
    short = cli(home, "add", "pat", stdin="short\n")
    bad_name = cli(home, "add", "Bad Name!", stdin="a long enough password\n")
    assert (2, 2) == (short.returncode, bad_name.returncode)
    assert "at least 12 characters" in short.stderr and "1-32 characters of a-z 0-9" in bad_name.stderr
    assert "Bad Name!" not in bad_name.stderr  # what was typed is not repeated: it may be a password
    assert 0 == cli(home, "add", "pat", stdin="a long enough password\n").returncode
    again = cli(home, "add", "pat", stdin="a long enough password\n")
    missing = cli(home, "rm", "nobody")
    assert (1, 1) == (again.returncode, missing.returncode)
    assert "already exists" in again.stderr and "no dashboard account named 'nobody'" in missing.stderr


def test_a_new_password_ends_the_sessions(home):
    import asyncio

    from schema import messages as m

    assert 0 == cli(home, "add", "sam", stdin="a long enough password\n").returncode

    async def login():
        async with home.client("t") as c:
            await c.call(m.DashboardLogin(username="sam", address="127.0.0.1", ok=True, token_hash="b" * 64,
                                          csrf="x", expires_at=time.time() + 60))

    asyncio.run(login())
    conn = reader(home)
    with db.read_tx(conn):
        assert dashboard_store.session(conn, "b" * 64, time.time()) is not None
    assert 0 == cli(home, "passwd", "sam", stdin="a brand new password\n").returncode
    with db.read_tx(conn):
        assert dashboard_store.session(conn, "b" * 64, time.time()) is None
    conn.close()
