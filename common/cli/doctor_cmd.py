"""`starling doctor [--deep] [--fix]`: checks of config, secrets, file modes, agent packs, database, disk, the
sandbox, the control address and port, and each service's state, each ok/warn/fail; `--deep` also calls the
model and each gateway's API once (common/probes.py), `--fix` repairs first (common/cli/doctor_fix.py)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import shutil
import socket
import stat
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import apsw
import msgspec

from common import db, health, personas, probes, sandbox
from common.cli import doctor_fix, held, output
from common.config import Config, is_local_url, is_loopback, load_config, required_secrets
from common.errors import ConfigError, DatabaseUnusable, SchemaTooNew, StarlingError
from common.home import Paths, paths_for, resolve_home
from common.secrets import env_names, list_secrets
from common.stores import beat_store, db_store, schema_store
from common.supervisor import Supervisor, expected_services

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
    doctor.add_argument("--deep", action="store_true",
                        help="also try each model (a one-token answer) and each gateway's API (getMe, auth.test,"
                             " the WhatsApp phone number)")
    doctor.add_argument("--fix", action="store_true",
                        help="first repair file modes, missing folders and a missing default agent, and say what"
                             " changed")
    doctor.add_argument("--json", action="store_true", help="print JSON for scripts")
    doctor.set_defaults(func=cmd_doctor)


# ------------------------------------------------------------------ the checks


def check_secrets(cfg: Config, paths: Paths) -> list[Check]:
    """The secrets this config reads when it runs (required_secrets: a gateway's for its mode, no key for a
    model server on this machine) must resolve; a secret named like a shell variable is a trap."""
    used = required_secrets(cfg)
    try:
        infos = list_secrets(paths.secrets_file, used)
    except StarlingError as exc:
        return [Check("secrets", FAIL, str(exc))]
    checks = []
    missing = [i.name for i in infos if i.source == "missing" and i.name in used]
    idle = _idle_provider_keys(cfg, paths, used)
    for name in missing:
        plain, prefixed = env_names(name)
        how = f"`starling secret set {name} --value-stdin`, or env {plain} / {prefixed}"
        if name in idle:  # the runner resolves a key at its first call: a provider no agent uses never asks
            checks.append(Check("secrets", WARN, f"{name!r} ({used[name]}) is not set, and no agent uses"
                                                 f" {', '.join(idle[name])} yet; before one does: {how}"))
        else:
            checks.append(Check("secrets", FAIL, f"{name!r} ({used[name]}) is not set: {how}"))
    if not missing:
        checks.append(Check("secrets", OK, f"all {len(used)} secrets this config needs resolve" if used
                            else "this config needs no secrets"))
    for name, provider in cfg.providers.items():
        if is_local_url(provider.base_url) and provider.api_key not in used:
            known = {i.name: i.source for i in infos}
            if known.get(provider.api_key, "missing") == "missing":
                checks.append(Check("secrets", OK, f"providers.{name}: no key set, none needed: {provider.base_url}"
                                                   " is on this machine, so no auth header is sent"))
    for info in infos:
        plain = env_names(info.name)[0]
        if plain in COMMON_ENV:
            checks.append(Check("secrets", WARN, f"secret {info.name!r} maps to ${plain}, which every shell sets and"
                                                 " which wins over secrets.json; rename it"))
    return checks


def _idle_provider_keys(cfg: Config, paths: Paths, used: dict[str, str]) -> dict[str, list[str]]:
    """Provider keys that only providers no agent pack names refer to: {secret: [providers.X, ...]}. Empty
    when a pack does not load (its provider is unknown, so every key counts)."""
    wanted = set()
    for pack in personas.list_packs(paths):
        try:
            wanted.add(personas.load_settings(pack.path).provider)
        except (ConfigError, OSError):
            return {}
    gateway_values = {v for gw in cfg.gateways.all() for v in msgspec.structs.asdict(gw).values() if isinstance(v, str)}
    users: dict[str, list[str]] = {}
    for name, provider in cfg.providers.items():
        if provider.api_key in used and not is_local_url(provider.base_url):
            users.setdefault(provider.api_key, []).append(name)
    return {secret: [f"providers.{n}" for n in names] for secret, names in users.items()
            if secret not in gateway_values and not wanted & set(names)}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def check_modes(paths: Paths) -> list[Check]:
    private_dirs = (paths.data_dir, paths.run_dir, paths.credentials_dir, paths.agents_dir)
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
            db.check_database(conn, db_file)  # the writer's check at boot, run to the end
        checks.append(Check("integrity", OK, f"{db_file.name}: quick_check ok"))
    except DatabaseUnusable as exc:  # the same words as the writer's refusal
        checks.append(Check("integrity", FAIL, str(exc)))
    except db.UNUSABLE_ERRORS as exc:
        checks.append(Check("integrity", FAIL, str(db.unusable(db_file, exc))))
    except apsw.Error as exc:
        checks.append(Check("integrity", FAIL, f"{db_file}: {exc}"))
    finally:
        conn.close()
    refused = db.refusal(db_file)
    if refused and all(c.status != FAIL for c in checks):
        checks.append(Check("database", FAIL, f"the writer refused it at its last start: {refused};"
                                              " once it is fixed, restart Starling (`starling down`, `starling up`)"))
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


def check_held(cfg: Config, paths: Paths) -> list[Check]:
    """Dead letters (events passed over, kept whole), gateways' spools, the writer's disk reserve."""
    found = held.read(paths)
    checks = []
    kept = (found.dead_letters or 0) + found.dead_letter_files
    if kept:
        files = f", {found.dead_letter_files} of them in {paths.dead_letters_dir}" if found.dead_letter_files else ""
        checks.append(Check("dead letters", WARN, f"{kept} events passed over (refused for themselves) and kept"
                                                  f" whole in the dead_letters table{files}; read them there"))
    else:
        checks.append(Check("dead letters", OK, "none"))
    for name, (events, size) in found.spools.items():
        if events:
            checks.append(Check("spool", WARN, f"{name}: {events} events acknowledged to the platform and not yet"
                                               f" stored ({size / 1024:.0f} KB): is the writer storing? is"
                                               f" {name} running?"))
    if cfg.writer.reserve_mb and paths.db_file.exists() and not found.reserve:  # (a writer has run here)
        checks.append(Check("disk reserve", WARN, f"{paths.data_dir / held.RESERVE_FILE} is missing: the data disk"
                                                  " filled (or had no room for it); the writer makes it again once"
                                                  " there is"))
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


def check_agents(cfg: Config, paths: Paths) -> list[Check]:
    """The agents folder, and each agent's pack: the default agent and every agent a gateway names must have
    one; each pack's files present, its config.toml and skills.toml valid, its provider configured."""
    folder = paths.agents_dir
    if not folder.is_dir():
        return [Check("agents", FAIL, f"{folder} (agents_dir) does not exist: `starling doctor --fix` creates it"
                                      f" with the {doctor_fix.DEFAULT_AGENT!r} agent")]
    wanted = {doctor_fix.DEFAULT_AGENT: "`starling chat` and cron jobs by default"}
    for platform in ("telegram", "slack", "whatsapp"):
        for i, gw in enumerate(getattr(cfg.gateways, platform)):
            wanted.setdefault(gw.agent, f"gateways.{platform}[{i}].agent")
    packs = {pack.id: pack for pack in personas.list_packs(paths)}
    checks = []
    for agent in sorted(set(wanted) - set(packs)):
        fix = "`starling doctor --fix` or " if agent == doctor_fix.DEFAULT_AGENT else ""
        checks.append(Check("agents", FAIL, f"agent {agent!r} (used by {wanted[agent]}) has no pack at"
                                            f" {folder / agent}: {fix}`starling agent new {agent}`"))
    for pack in packs.values():
        checks += _check_pack(cfg, pack)
    return checks


def _check_pack(cfg: Config, pack: personas.PackInfo) -> list[Check]:
    name = f"agent {pack.id!r}"
    try:
        settings = personas.load_settings(pack.path)
        skills = personas.load_skills_file(pack.path).skills
    except ConfigError as exc:
        return [Check("agents", FAIL, str(exc))]
    except OSError as exc:
        return [Check("agents", FAIL, f"{pack.path}: cannot read: {exc.strerror}")]
    checks = []
    if settings.provider not in cfg.providers:
        checks.append(Check("agents", FAIL, f"{pack.path / 'config.toml'}: provider = {settings.provider!r}: no"
                                            f" [providers.{settings.provider}] in config.toml (configured:"
                                            f" {', '.join(sorted(cfg.providers)) or 'none'})"))
    unknown = [t for t in settings.tools if t not in personas.DEFAULT_TOOLS]
    if unknown:
        checks.append(Check("agents", WARN, f"{pack.path / 'config.toml'}: tools: unknown {', '.join(map(repr, unknown))}"
                                            f" (ignored); expected some of {', '.join(personas.DEFAULT_TOOLS)}"))
    lacking = [s for s in skills if s not in pack.skills]
    if lacking:
        checks.append(Check("agents", WARN, f"{pack.path / 'skills.toml'}: no skills/<name>/SKILL.md for"
                                            f" {', '.join(map(repr, lacking))} (not offered)"))
    if pack.missing:
        checks.append(Check("agents", WARN, f"{name}: {', '.join(pack.missing)} missing in {pack.path} (the runner"
                                            " goes on without them: defaults for config.toml)"))
    if not checks:
        model = settings.model or cfg.providers[settings.provider].model
        checks.append(Check("agents", OK, f"{name}: pack complete; provider {settings.provider} ({model}),"
                                          f" approval {settings.approval.mode}, {len(pack.skills)} skills"))
    return checks


def check_services(cfg: Config, paths: Paths) -> list[Check]:
    """With supervisord up, every service the config expects is RUNNING and still beating."""
    sup = Supervisor(paths)
    if not sup.reachable():
        return [Check("services", WARN, "not running — start with `starling up`")]
    try:
        states = {p.name: p for p in sup.processes()}
    except StarlingError as exc:
        return [Check("services", FAIL, str(exc))]
    beats = _beats(paths)
    stale_s = health.STALE_AFTER_BEATS * cfg.health.heartbeat_interval_ms / 1000
    checks, running = [], []
    for name in expected_services(cfg):
        info = states.get(name)
        if info is None:
            checks.append(Check("services", FAIL, f"{name} is not known to supervisord (the config changed since"
                                                  " `starling up`? run `starling down` and `starling up`)"))
        elif info.state == "STARTING":
            checks.append(Check("services", WARN, f"{name} is starting"))
        elif info.state != "RUNNING":
            checks.append(Check("services", FAIL, f"{name} is {info.state}" + (f" ({info.description})"
                                                  if info.description else "") + f": see `starling logs {name}`"))
        elif (beat := beats.get(name)) and beat.pid == info.pid and time.time() - beat.beat_at > stale_s:
            checks.append(Check("services", WARN, f"{name} runs but has not reported for"
                                                  f" {time.time() - beat.beat_at:.0f} s: see `starling logs {name}`"))
        else:
            running.append(name)
    if running:
        checks.insert(0, Check("services", OK, f"{len(running)} running: {', '.join(running)}"))
    return checks


def _beats(paths: Paths) -> dict[str, beat_store.Beat]:
    if not paths.db_file.exists():
        return {}
    try:
        conn = db.open_reader(paths.db_file)
    except (StarlingError, apsw.Error):
        return {}
    try:
        with db.read_tx(conn):
            return {b.service: b for b in beat_store.all_beats(conn)}
    except apsw.Error:
        return {}
    finally:
        conn.close()


def check_control_port(cfg: Config, paths: Paths) -> Check:
    """Starling up: the control service answers /livez on its port. Down: the port is free for `up`."""
    listen = cfg.control.listen
    host, _, port = listen.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if Supervisor(paths).reachable():
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/livez"
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 - a loopback URL of our config
                return Check("control port", OK, f"control answers on {listen} (/livez {resp.status})")
        except urllib.error.HTTPError as exc:
            return Check("control port", FAIL, f"{listen} answers /livez with HTTP {exc.code}: another program?")
        except OSError as exc:
            reason = getattr(exc, "reason", None) or exc
            return Check("control port", FAIL, f"nothing answers on {listen} ({reason}): see `starling logs control`")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return Check("control port", FAIL, f"{listen} is held by another program, so control could not"
                                                   " start: stop it, or set another [control] listen")
            return Check("control port", FAIL, f"cannot listen on {listen}: {exc.strerror}")
    return Check("control port", OK, f"{listen} is free")


def check_mcp(cfg: Config, paths: Paths) -> list[Check]:
    """Each [mcp.<name>] server started (confined) or reached, and its tools listed, as for the first agent that
    lists it (common/mcp_client.py); an agent that lists a server config.toml lacks fails. None: no lines."""
    users: dict[str, list[str]] = {}
    checks = []
    for pack in personas.list_packs(paths):
        try:
            wanted = personas.load_settings(pack.path).mcp
        except StarlingError:
            continue  # the agents check names a broken pack
        for name in wanted:
            if name in cfg.mcp:
                users.setdefault(name, []).append(pack.id)
            else:
                checks.append(Check("mcp", FAIL, f"agent {pack.id!r} lists MCP server {name!r}, which config.toml"
                                                 f" does not define (add [mcp.{name}])"))
    if not cfg.mcp:
        return checks
    from common import mcp_client  # the SDK: imported only when servers are configured

    async def all_servers():
        return await asyncio.gather(*(mcp_client.check(paths, cfg, name, users.get(name, ["default"])[0])
                                      for name in cfg.mcp))

    for name, (ok, reason) in zip(cfg.mcp, asyncio.run(all_servers())):
        status = (OK if name in users else WARN) if ok else FAIL
        unused = "" if name in users else "; no agent lists it (mcp = [...] in an agent's config.toml)"
        checks.append(Check("mcp", status, f"{name}: {reason}{unused}"))
    return checks


def check_deep(cfg: Config, paths: Paths) -> list[Check]:
    """One live call to each model provider and each gateway's API (common/probes.py)."""
    found = asyncio.run(probes.probe_all(cfg, paths.secrets_file, paths.whatsapp_dir))
    return [Check("model" if p.name.startswith("model ") else "gateway", OK if p.ok else FAIL,
                  f"{p.name.split(' ', 1)[1] if p.name.startswith('model ') else p.name}: {p.reason}")
            for p in found]


def run_checks(home: Path, deep: bool = False) -> list[Check]:
    config_file = home / "config.toml"
    try:
        cfg = load_config(config_file)
    except ConfigError as exc:
        return [Check("config", FAIL, str(exc))]
    checks = [Check("config", OK, f"{config_file} is valid")]
    paths = paths_for(home, cfg)
    checks += check_secrets(cfg, paths)
    checks += check_modes(paths)
    checks += check_agents(cfg, paths)
    checks += check_database(cfg, paths)
    checks += check_disk(cfg, paths)
    checks += check_held(cfg, paths)
    checks.append(check_sandbox(cfg))
    checks.append(check_control(cfg))
    checks.append(check_control_port(cfg, paths))
    checks += check_mcp(cfg, paths)
    checks += check_services(cfg, paths)
    if deep:
        checks += check_deep(cfg, paths)
    return checks


# ------------------------------------------------------------------ the verb


def cmd_doctor(args: argparse.Namespace) -> int:
    home = resolve_home(args.home)
    fixed = doctor_fix.fix(home) if args.fix else []
    checks = run_checks(home, deep=args.deep)
    failed = any(c.status == FAIL for c in checks)
    if args.json:
        output.emit_json({"home": str(home), "ok": not failed, "checks": [asdict(c) for c in checks],
                          "fixed": fixed})
        return 1 if failed else 0
    for line in fixed:
        print(output.paint("fixed", "green") + "  " + line)
    if args.fix:
        broken = checks[0].name == "config" and checks[0].status == FAIL
        print(("nothing fixed: config.toml does not load (below)" if broken else "nothing to fix" if not fixed
               else f"{len(fixed)} fixed") + "\n")
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(output.paint(c.status.ljust(4), _STATUS_COLOUR[c.status]) + "  " + c.name.ljust(width) + "  " + c.reason)
    counts = {s: sum(c.status == s for c in checks) for s in (OK, WARN, FAIL)}
    print()
    print(f"{counts[OK]} ok, {counts[WARN]} warnings, {counts[FAIL]} failed")
    return 1 if failed else 0
