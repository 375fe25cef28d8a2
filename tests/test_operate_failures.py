"""`starling up` refuses to start on bad input, and says which service did not come up and why."""

from __future__ import annotations

import socket

from common import db
from common.stores import schema_store
from common.supervisor import Supervisor
from tests.procs import make_home, remove_home
from tests.test_operate import starling


def test_an_invalid_config_fails_up_before_any_process_starts(home):
    (home.root / "config.toml").write_text('[runner]\nprocesses = "two"\n')
    result = starling(home, "up")
    assert (1, True, True, False) == (
        result.returncode, "config.toml: runner.processes:" in result.stderr, "int" in result.stderr,
        Supervisor(home.paths).reachable(),
    ), result.stderr


def test_doctor_fails_fast_on_the_same_invalid_config(home):
    (home.root / "config.toml").write_text("[control]\nlisten = 7820\n")
    result = starling(home, "doctor")
    assert (1, True) == (result.returncode, "control.listen" in result.stdout + result.stderr)


def test_a_database_newer_than_the_code_fails_up_with_a_clear_message(home):
    conn = db.open_writer(home.paths.db_file)
    schema_store.migrate(conn, home.paths.db_file)
    schema_store.force_version(conn, schema_store.code_version() + 5)
    conn.close()
    result = starling(home, "up")
    assert (1, True, False) == (
        result.returncode, "is newer than this Starling knows" in result.stderr, Supervisor(home.paths).reachable(),
    ), result.stderr


def test_up_names_the_service_that_did_not_become_ready_and_why():
    # control cannot read its token (a folder where the file belongs): it starts, fails, and is retried.
    # (A control port another program holds is refused before anything starts: tests/test_homes.py.)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    home = make_home(f'[control]\nlisten = "127.0.0.1:{port}"\n[runner]\nprocesses = 1\n')
    home.paths.control_token_file.unlink(missing_ok=True)
    home.paths.control_token_file.mkdir()
    try:
        result = starling(home, "up", "--timeout", "6")
        assert (1, True) == (result.returncode, "not ready after 6s: control" in result.stderr), result
        assert "cannot create or read token file: is a directory" in result.stdout.lower(), result.stdout
    finally:
        starling(home, "down")
        remove_home(home)
