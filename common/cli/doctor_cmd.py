"""`starling doctor`: checks of config, secrets, file modes, database, disk, the sandbox, the control address and
supervisord, each ok/warn/fail."""

from __future__ import annotations

import argparse
import shutil
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

import apsw

from common import db, health, sandbox
from common.cli import output
from common.config import Config, is_loopback, load_config, referenced_secrets
from common.errors import ConfigError, SchemaTooNew, StarlingError
from common.home import Paths, paths_for, resolve_home
from common.secrets import env_names, list_secrets
from common.stores import db_store, schema_store
from common.supervisor import Supervisor

OK, WARN, FAIL = "ok", "warn", "fail"
COMMON_ENV = ("PATH", "HOME", "USER", "SHELL", "PWD", "LANG", "TERM")
_STATUS_COLOUR = {OK: "green", WARN: "yellow", FAIL: "red"}
MB = 1024 * 1024


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    reason: str


def register(verbs) -> None:
    doctor = verbs.add_parser(
        "doctor", help="check config, secrets, file modes, database, disk and services",
        description="Each check is ok, warn or fail with a one-line reason; exit 1 when any fails.",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON for scripts")
    doctor.set_defaults(func=cmd_doctor)


# ------------------------------------------------------------------ the checks


def check_secrets(cfg: Config, paths: Paths) -> list[Check]:
    used = referenced_secrets(cfg)
    try:
        infos = list_secrets(paths.secrets_file, used)
    except StarlingError as exc:
        return [Check("secrets", FAIL, str(exc))]
    checks = []
    missing = [i.name for i in infos if i.source == "missing" and i.name in used]
    for name in missing:
        plain, prefixed = env_names(name)
        checks.append(Check("secrets", FAIL, f"{name!r} ({used[name]}) is not set: `starling secret set {name}"
                                             f" --value-stdin`, or env {plain} / {prefixed}"))
    if not missing:
        checks.append(Check("secrets", OK, f"all {len(used)} referenced secrets resolve" if used
                            else "config refers to no secrets"))
    for info in infos:
        plain = env_names(info.name)[0]
        if plain in COMMON_ENV:
            checks.append(Check("secrets", WARN, f"secret {info.name!r} maps to ${plain}, which every shell sets and"
                                                 " which wins over secrets.json; rename it"))
    return checks


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def check_modes(paths: Paths) -> list[Check]:
    private_dirs = (paths.data_dir, paths.run_dir, paths.credentials_dir)
    private_files = (paths.secrets_file, paths.control_token_file, paths.session_secret_file, paths.db_file)
    checks = []
    looked = 0
    for folder in private_dirs:
        if not folder.exists():
            checks.append(Check("modes", WARN, f"{folder} does not exist; `starling init` creates it"))
            continue
        looked += 1
        if _mode(folder) & 0o077:
            checks.append(Check("modes", FAIL, f"{folder} is {_mode(folder):04o}, expected 0700: chmod 700 {folder}"))
    for file in private_files:
        if not file.exists():
            continue
        looked += 1
        if _mode(file) & 0o077:
            checks.append(Check("modes", FAIL, f"{file} is {_mode(file):04o}, expected 0600: chmod 600 {file}"))
    looked += 1
    if _mode(paths.config_file) & 0o007:
        checks.append(Check("modes", FAIL, f"{paths.config_file} is {_mode(paths.config_file):04o} and readable by"
                                           f" everyone: chmod 600 {paths.config_file}"))
    if not any(c.status == FAIL for c in checks):
        checks.append(Check("modes", OK, f"{looked} private folders and files are not open to others"))
    return checks


def check_database(cfg: Config, paths: Paths) -> list[Check]:
    db_file = paths.db_file
    if not db_file.exists():
        return [Check("database", WARN, f"{db_file} does not exist yet; the writer creates it (`starling up`)")]
    try:
        conn = db.open_reader(db_file)
    except (StarlingError, apsw.Error) as exc:
        return [Check("database", FAIL, f"{db_file}: cannot open: {exc}")]
    checks = []
    try:
        with db.read_tx(conn):
            known = schema_store.code_version()
            try:
                current = schema_store.check_not_newer(conn, db_file)
            except SchemaTooNew as exc:
                return [Check("schema", FAIL, str(exc))]
            if current < known:
                checks.append(Check("schema", WARN, f"version {current}, this Starling's is {known};"
                                                    " the writer migrates it when it starts"))
            else:
                checks.append(Check("schema", OK, f"version {current}"))
            problems = db_store.integrity_check(conn, quick=True)
        if problems == ["ok"]:
            checks.append(Check("integrity", OK, f"{db_file.name}: quick_check ok"))
        else:
            checks.append(Check("integrity", FAIL, f"{db_file.name}: {'; '.join(problems[:3])}"
                                                   + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")))
    except apsw.Error as exc:
        checks.append(Check("integrity", FAIL, f"{db_file}: {exc}"))
    finally:
        conn.close()
    wal = Path(str(db_file) + "-wal")
    wal_mb = health.wal_bytes(db_file) / MB
    limit = cfg.health.wal_warn_threshold_mb
    if wal_mb > limit:
        checks.append(Check("wal", WARN, f"{wal.name} is {wal_mb:.1f} MB,"
                                         f" over health.wal_warn_threshold_mb = {limit:g};"
                                         " a long reader may be holding back checkpoints"))
    else:
        checks.append(Check("wal", OK, f"{wal_mb:.1f} MB (warn over {limit:g} MB)"))
    return checks


def check_disk(cfg: Config, paths: Paths) -> list[Check]:
    limit = cfg.health.disk_warn_threshold_mb
    checks = []
    seen: set[int] = set()
    for key, folder in (("data_dir", paths.data_dir), ("agents_dir", paths.agents_dir),
                        ("workspace_dir", paths.workspace_dir)):
        if not folder.exists():
            continue
        device = folder.stat().st_dev
        if device in seen:
            continue
        seen.add(device)
        free_mb = shutil.disk_usage(folder).free / MB
        status = WARN if free_mb < limit else OK
        checks.append(Check("disk", status, f"{key} ({folder}): {free_mb:,.0f} MB free"
                                            + (f", under health.disk_warn_threshold_mb = {limit:g}" if status == WARN
                                               else "")))
    return checks


def check_sandbox(cfg: Config) -> Check:
    """What confines the agent's commands on this host (probed for real, as the runner does)."""
    found = sandbox.probe(cfg.tools.sandbox)
    if found.mode == sandbox.NO_SANDBOX:
        return Check("sandbox", WARN, "[tools] sandbox = \"none\": shell commands and jobs run unconfined,"
                                      " as the runner's user")
    if not found.confined:
        return Check("sandbox", WARN, found.off_reason())
    missing = f" (not available: {found.reason})" if found.reason else ""
    return Check("sandbox", OK, ", ".join(found.layers()) + missing)


def check_control(cfg: Config) -> Check:
    listen = cfg.control.listen
    if cfg.control.allow_remote and not is_loopback(listen):
        return Check("control", WARN, f"[control] allow_remote = true and listen = {listen!r}: the control API"
                                      " (token-guarded) and /health are reachable from the network; put TLS and a"
                                      " firewall in front, or listen on 127.0.0.1")
    if cfg.control.allow_remote:
        return Check("control", WARN, f"[control] allow_remote = true (listen = {listen!r} is loopback today):"
                                      " a later non-loopback listen will not be refused")
    return Check("control", OK, f"listens on {listen}, loopback only")


def check_supervisor(paths: Paths) -> Check:
    if Supervisor(paths).reachable():
        return Check("services", OK, "supervisord is running")
    return Check("services", WARN, "not running — start with `starling up`")


def run_checks(home: Path) -> list[Check]:
    config_file = home / "config.toml"
    try:
        cfg = load_config(config_file)
    except ConfigError as exc:
        return [Check("config", FAIL, str(exc))]
    checks = [Check("config", OK, f"{config_file} is valid")]
    paths = paths_for(home, cfg)
    checks += check_secrets(cfg, paths)
    checks += check_modes(paths)
    checks += check_database(cfg, paths)
    checks += check_disk(cfg, paths)
    checks.append(check_sandbox(cfg))
    checks.append(check_control(cfg))
    checks.append(check_supervisor(paths))
    return checks


# ------------------------------------------------------------------ the verb


def cmd_doctor(args: argparse.Namespace) -> int:
    home = resolve_home(args.home)
    checks = run_checks(home)
    failed = any(c.status == FAIL for c in checks)
    if args.json:
        output.emit_json({"home": str(home), "ok": not failed, "checks": [asdict(c) for c in checks]})
        return 1 if failed else 0
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(output.paint(c.status.ljust(4), _STATUS_COLOUR[c.status]) + "  " + c.name.ljust(width) + "  " + c.reason)
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    print()
    print(f"{counts[OK]} ok, {counts[WARN]} warnings, {counts[FAIL]} failed")
    return 1 if failed else 0
