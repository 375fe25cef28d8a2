"""`starling doctor`: ok on a healthy home; exit 1 on a broken config, a newer schema, loose modes, missing secrets."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from common import db
from common.cli.main import main
from common.config import default_config_text
from common.errors import SchemaTooNew
from common.secrets import set_secret
from common.stores import schema_store
from tests.procs import make_home, start_writer


def doctor(capsys, root: Path) -> tuple[int, dict[str, list[tuple[str, str]]]]:
    """Exit code, and each check's (status, reason) by name."""
    rc = main(["--home", str(root), "doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    checks: dict[str, list[tuple[str, str]]] = {}
    for check in report["checks"]:
        checks.setdefault(check["name"], []).append((check["status"], check["reason"]))
    return rc, checks


def statuses(checks: dict[str, list[tuple[str, str]]], name: str) -> list[str]:
    return [status for status, _ in checks.get(name, [])]


@pytest.fixture
def root(capsys, monkeypatch) -> Path:
    """A home made by `starling init` (short path under /tmp, for the writer's socket), model key set."""
    for var in ("OPENAI", "STARLING_SECRET_OPENAI"):
        monkeypatch.delenv(var, raising=False)
    root = Path(tempfile.mkdtemp(prefix="st", dir="/tmp"))
    assert 0 == main(["--home", str(root), "init"])
    capsys.readouterr()
    set_secret(root / "data/secrets.json", "openai", "sk-doctor-test-value")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def make_db(root: Path, version_offset: int = 0) -> None:
    """A migrated database, as the writer leaves it, optionally claiming a newer schema."""
    db_file = root / "data/starling.db"
    conn = db.open_writer(db_file)
    schema_store.migrate(conn, db_file)
    if version_offset:
        schema_store.force_version(conn, schema_store.code_version() + version_offset)
    conn.close()


def test_a_healthy_fresh_home_with_a_writer_made_database_passes(capsys, root):
    proc = start_writer(make_home(root=root, keep_config=True))
    try:
        rc, checks = doctor(capsys, root)
    finally:
        proc.stop()
    failed = [(name, reason) for name, found in checks.items() for status, reason in found if status == "fail"]
    assert (0, [], ["ok"], ["ok"]) == (rc, failed, statuses(checks, "schema"), statuses(checks, "integrity"))


def test_the_human_report_has_a_line_per_check_and_a_summary(capsys, root):
    rc = main(["--home", str(root), "doctor"])
    lines = capsys.readouterr().out.splitlines()
    assert (0, "ok    config", True) == (rc, lines[0][:12], lines[-1].endswith("0 failed"))


def test_a_broken_config_fails_naming_file_and_key_and_stops(capsys, root):
    (root / "config.toml").write_text(default_config_text().replace("processes = 2", 'processes = "two"'))
    rc, checks = doctor(capsys, root)
    [(status, reason)] = checks["config"]
    assert (1, "fail", True, True, ["config"]) == (
        rc, status, str(root / "config.toml") in reason, "runner.processes" in reason, list(checks))


def test_a_database_newer_than_the_code_fails(capsys, root):
    make_db(root, version_offset=1)
    rc, checks = doctor(capsys, root)
    known = schema_store.code_version()
    expected = str(SchemaTooNew(root / "data/starling.db", known + 1, known))
    assert (1, [("fail", expected)]) == (rc, checks["schema"])


def test_a_database_at_the_code_version_is_ok(capsys, root):
    make_db(root)
    rc, checks = doctor(capsys, root)
    assert (0, ["ok"], ["ok"], ["ok"]) == (rc, statuses(checks, "schema"), statuses(checks, "integrity"),
                                            statuses(checks, "wal"))


def test_no_database_yet_is_a_warning(capsys, root):
    rc, checks = doctor(capsys, root)
    assert (0, ["warn"]) == (rc, statuses(checks, "database"))


def test_a_missing_referenced_secret_fails_by_name(capsys, root):
    (root / "data/secrets.json").unlink()
    rc, checks = doctor(capsys, root)
    [(status, reason)] = checks["secrets"]
    assert (1, "fail", True) == (rc, status, reason.startswith("'openai' (providers.default.api_key) is not set"))


def test_a_secret_from_the_environment_counts_as_set(capsys, root, monkeypatch):
    (root / "data/secrets.json").unlink()
    monkeypatch.setenv("STARLING_SECRET_OPENAI", "from-env")
    rc, checks = doctor(capsys, root)
    assert (0, ["ok"]) == (rc, statuses(checks, "secrets"))


def test_doctor_never_prints_a_secret_value(capsys, root):
    main(["--home", str(root), "doctor"])
    out, err = capsys.readouterr()
    assert False is ("sk-doctor-test-value" in out + err)


def test_a_secret_named_like_a_common_env_var_warns(capsys, root):
    set_secret(root / "data/secrets.json", "home", "not-the-home-folder")
    rc, checks = doctor(capsys, root)
    warnings = [reason for status, reason in checks["secrets"] if status == "warn"]
    assert (0, 1, True) == (rc, len(warnings), "$HOME" in warnings[0])


@pytest.mark.parametrize("relative, loose", [("data/secrets.json", 0o644), ("data/.control-token", 0o640),
                                             ("data/run", 0o755), ("data/credentials", 0o750),
                                             ("config.toml", 0o604)])
def test_loose_modes_fail(capsys, root, relative, loose):
    os.chmod(root / relative, loose)
    rc, checks = doctor(capsys, root)
    failed = [reason for status, reason in checks["modes"] if status == "fail"]
    assert (1, 1, True) == (rc, len(failed), str(root / relative) in failed[0])


def test_a_group_readable_config_is_allowed(capsys, root):
    os.chmod(root / "config.toml", 0o640)
    rc, checks = doctor(capsys, root)
    assert (0, ["ok"]) == (rc, statuses(checks, "modes"))


def test_a_wal_over_its_threshold_warns(capsys, root):
    text = default_config_text().replace("wal_warn_threshold_mb = 100", "wal_warn_threshold_mb = 0.001")
    (root / "config.toml").write_text(text)
    db_file = root / "data/starling.db"
    conn = db.open_writer(db_file)  # held open: the migration's pages stay in the WAL (no auto-checkpoint)
    try:
        schema_store.migrate(conn, db_file)
        rc, checks = doctor(capsys, root)
    finally:
        conn.close()
    [(status, reason)] = checks["wal"]
    assert (0, "warn", True) == (rc, status, "over health.wal_warn_threshold_mb = 0.001" in reason)


def test_low_disk_space_warns(capsys, root):
    text = default_config_text().replace("disk_warn_threshold_mb = 1024", "disk_warn_threshold_mb = 1000000000")
    (root / "config.toml").write_text(text)
    rc, checks = doctor(capsys, root)
    assert (0, "warn") == (rc, statuses(checks, "disk")[0])


def test_the_control_address_is_ok_on_loopback_and_warned_with_allow_remote(capsys, root):
    assert ["ok"] == statuses(doctor(capsys, root)[1], "control")
    config = root / "config.toml"
    text = config.read_text().replace('listen = "127.0.0.1:', 'listen = "0.0.0.0:', 1)
    config.write_text(text.replace("allow_remote = false", "allow_remote = true", 1))
    rc, checks = doctor(capsys, root)
    [(status, reason)] = checks["control"]
    assert ("warn", True) == (status, "reachable from the network" in reason)


def test_supervisord_not_running_is_a_warning(capsys, root):
    _, checks = doctor(capsys, root)
    assert [("warn", "not running — start with `starling up`")] == checks["services"]
