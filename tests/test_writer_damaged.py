"""The writer on a damaged or foreign file: one clear fatal line naming the file and the way out, no
traceback, exit 78, which supervisord and systemd do not restart; status, doctor and the services that
wait for the schema say the same."""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common import db
from common.cli import main as cli
from common.errors import SchemaNotReady
from common.stores import db_store, schema_store, session_store, turn_store
from common.supervisor import Supervisor
from services.writer import startup
from tests.procs import REPO, Proc, make_home, remove_home, start_writer, wait_until

WAY_OUT = ("Starling will not start on it. Stop Starling (`starling down`), then restore a backup"
           " (`starling backup list`, then `starling backup restore PATH --force`)")


def _good_database(db_file: Path, rows: int = 3000) -> None:
    conn = db.open_writer(db_file)
    schema_store.migrate(conn, db_file)
    session = session_store.open_session(conn, "default", "test", "c", time.time())
    db_store.begin(conn)
    turn_store.insert_raw(conn, [(session, f"turn {i} " + "x" * 300, "u", time.time()) for i in range(rows)])
    db_store.commit(conn)
    db_store.checkpoint(conn, "TRUNCATE")
    conn.close()


def _truncated(db_file: Path) -> None:
    os.truncate(db_file, db_file.stat().st_size // 2)


def _flipped_page(db_file: Path) -> None:
    pages = db_file.stat().st_size // 4096
    with open(db_file, "r+b") as f:
        f.seek(pages // 2 * 4096)
        f.write(random.Random(13).randbytes(4096))


def _foreign(db_file: Path) -> None:
    db_file.write_bytes(b"name,chat\nalice,42\n" * 500)  # a CSV where the database should be


def _newer_schema(db_file: Path) -> None:
    conn = db.open_writer(db_file)
    schema_store.force_version(conn, schema_store.code_version() + 1)
    conn.close()


DAMAGE = {
    "truncated": (_truncated, "damaged"),
    "flipped page": (_flipped_page, "damaged"),
    "not sqlite": (_foreign, "not a SQLite database"),
    "newer schema": (_newer_schema, "is newer than this Starling knows"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_the_writer_refuses_a_bad_file_once_clearly_with_exit_78(home, kind):
    damage, words = DAMAGE[kind]
    _good_database(home.paths.db_file)
    damage(home.paths.db_file)
    before = hashlib.sha256(home.paths.db_file.read_bytes()).hexdigest()
    proc = Proc(home, "writer")
    code = proc.popen.wait(30)
    proc.stop()
    text = proc.log_text()
    fatal = [json.loads(line) for line in text.splitlines() if '"database_refused"' in line]
    stderr = [line for line in text.splitlines() if line.startswith("starling-writer: fatal: ")]
    assert (startup.EXIT_REFUSED, 1, 1, False) == (code, len(fatal), len(stderr), "Traceback" in text), text
    error = fatal[0]["error"]
    assert error.startswith(f"{home.paths.db_file}: ") and words in error
    assert WAY_OUT in error or "restore a backup made by this version" in error
    assert stderr[0] == f"starling-writer: fatal: {error}"
    assert before == hashlib.sha256(home.paths.db_file.read_bytes()).hexdigest()  # nothing written to it
    assert error == db.refusal(home.paths.db_file)


def test_status_doctor_and_the_waiting_services_give_the_writers_reason(home, capsys):
    _good_database(home.paths.db_file)
    _flipped_page(home.paths.db_file)
    proc = Proc(home, "writer")
    assert startup.EXIT_REFUSED == proc.popen.wait(30)
    proc.stop()
    reason = db.refusal(home.paths.db_file)
    capsys.readouterr()
    assert 3 == cli.main(["--home", str(home.root), "status", "--json"])  # 3: an expected service is not running
    status = json.loads(capsys.readouterr().out)
    writer = next(s for s in status["services"] if s["service"] == "writer")
    assert ("REFUSED", reason, reason) == (writer["state"], writer["detail"], status["refused"])
    assert 1 == cli.main(["--home", str(home.root), "doctor", "--json"])
    failed = [c["reason"] for c in json.loads(capsys.readouterr().out)["checks"] if c["status"] == "fail"]
    assert reason in failed
    started = time.monotonic()
    with pytest.raises(SchemaNotReady, match="the writer refused the database: .*damaged"):
        db.wait_for_schema(home.paths.db_file, timeout_s=0.3)
    assert time.monotonic() - started < 5


def test_a_restored_file_clears_the_refusal(home):
    _foreign(home.paths.db_file)
    proc = Proc(home, "writer")
    assert startup.EXIT_REFUSED == proc.popen.wait(30)
    proc.stop()
    assert db.refusal(home.paths.db_file)
    home.paths.db_file.unlink()  # moved aside: the writer starts on an empty database
    writer = start_writer(home)
    try:
        assert (None, True) == (db.refusal(home.paths.db_file), '"quick_check_ok"' in writer.log_text())
        db.wait_for_schema(home.paths.db_file, timeout_s=10).close()
    finally:
        writer.stop()


def test_the_quick_check_at_boot_is_cut_short_on_time(tmp_path):
    db_file = tmp_path / "starling.db"
    _good_database(db_file)
    conn = db.open_reader(db_file)
    try:
        started = time.monotonic()
        assert (False, True) == (db.check_database(conn, db_file, 0.0), db.check_database(conn, db_file, None))
        assert time.monotonic() - started < 5
    finally:
        conn.close()


def test_supervisord_and_systemd_do_not_restart_a_refusal():
    conf = configparser.RawConfigParser(inline_comment_prefixes=(";",))
    conf.read(REPO / "supervisord.conf")
    writer = conf["program:writer"]
    codes = [int(c) for c in writer["exitcodes"].split(",")]
    assert ("unexpected", True, True) == (writer["autorestart"], 78 in codes, 0 not in codes)
    assert float(writer["startsecs"]) == startup.SUPERVISOR_STARTSECS_S < startup.REFUSAL_UPTIME_S
    unit = (REPO / "deploy" / "systemd" / "starling-writer.service").read_text()
    prevent = [line.split("=", 1)[1].split() for line in unit.splitlines() if line.startswith("RestartPreventExitStatus=")]
    assert [["78"]] == prevent and startup.EXIT_REFUSED == 78


def test_up_on_a_damaged_file_reports_the_refusal_and_supervisord_leaves_the_writer_down():
    home = make_home("[runner]\nprocesses = 1\n")  # fewer processes to stop at the end
    _good_database(home.paths.db_file)
    _flipped_page(home.paths.db_file)
    run = [sys.executable, "-m", "common.cli", "--home", str(home.root)]
    started = time.monotonic()
    up = subprocess.run([*run, "up", "--timeout", "40"], cwd=REPO, capture_output=True, text=True, timeout=90)
    try:
        took = time.monotonic() - started
        assert (1, True) == (up.returncode, "writer: REFUSED: " in up.stdout), up
        assert took < 25, f"up waited {took:.0f}s instead of seeing the refusal"
        sup = Supervisor(home.paths)

        def writer_state() -> str:
            return next(p.state for p in sup.processes() if p.name == "writer")

        wait_until(lambda: writer_state() == "EXITED", timeout=20, what="the writer to be EXITED")
        time.sleep(2)  # past supervisord's first backoff (1 s): a retry would show by now
        log = (home.paths.logs_dir / "writer.log").read_text()
        assert ("EXITED", 1) == (writer_state(), log.count('"database_refused"')), log
        status = subprocess.run([*run, "status", "--json"], cwd=REPO, capture_output=True, text=True, timeout=30)
        writer = next(s for s in json.loads(status.stdout)["services"] if s["service"] == "writer")
        assert "REFUSED" == writer["state"]
    finally:
        subprocess.run([*run, "down"], cwd=REPO, capture_output=True, text=True, timeout=90)
        remove_home(home)


def test_up_refuses_a_file_that_is_not_a_database_before_starting_anything(home, capsys):
    _foreign(home.paths.db_file)
    assert 1 == cli.main(["--home", str(home.root), "up"])
    err = capsys.readouterr().err
    assert (True, True, False) == (str(home.paths.db_file) in err, WAY_OUT in err, Supervisor(home.paths).reachable())
