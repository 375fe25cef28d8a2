"""`starling init [--force]`: create a home with a commented config, private state folders, tokens and an agent."""

from __future__ import annotations

import argparse
import os

from common import dashboard_setup, personas, ports, registry
from common.cli import output
from common.cli.context import shown
from common.config import default_config_text, load_config
from common.errors import StarlingError
from common.home import DIR_MODE, ensure_layout, ensure_token_file, paths_for, resolve_home, write_private_file

DEFAULT_AGENT = "default"


def register(verbs) -> None:
    init = verbs.add_parser(
        "init", help="create a Starling home: config.toml, state folders, tokens, a default agent",
        description="Create the home (--home, $STARLING_HOME or ./.starling). Safe to run again: "
                    "what exists is kept, and folders that are too open are tightened to 0700.",
    )
    init.add_argument("--force", action="store_true", help="overwrite an existing config.toml with the defaults")
    init.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    home = resolve_home(args.home)
    created: list[str] = []
    kept: list[str] = []
    if home.exists() and not home.is_dir():
        raise StarlingError(f"--home {shown(home)} is a file; a Starling home is a folder (give another path)")
    home.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    config_file = home / "config.toml"
    existed = config_file.exists()
    if existed and not args.force:
        kept.append(f"{config_file} (exists; --force replaces it with the defaults)")
    else:
        port = _control_port()
        write_private_file(config_file, default_config_text().replace(
            f'listen = "127.0.0.1:{ports.FIRST_CONTROL_PORT}"', f'listen = "127.0.0.1:{port}"', 1).encode())
        created.append(f"{config_file}" + (" (replaced with the defaults)" if existed else "")
                       + f" (control on 127.0.0.1:{port})")
    cfg = load_config(config_file)  # an existing config that is invalid stops here, naming key and reason
    paths = paths_for(home, cfg)
    missing = [folder for folder in paths.layout() if not folder.exists()]
    ensure_layout(paths)
    if missing:
        created.append(f"state folders under {home} (mode 0700): {len(missing)}")
    tokens = [paths.control_token_file]
    if os.environ.get("SESSION_SECRET"):
        kept.append(f"{paths.session_secret_file} (not made: $SESSION_SECRET is set)")
    else:
        tokens.append(paths.session_secret_file)
    for token in tokens:
        (kept if token.exists() else created).append(str(token))
        ensure_token_file(token)
    agent_dir = paths.agents_dir / DEFAULT_AGENT
    if agent_dir.exists():
        kept.append(f"{agent_dir} (agent {DEFAULT_AGENT!r})")
    else:
        personas.create_pack(paths, DEFAULT_AGENT)
        created.append(f"{agent_dir} (agent {DEFAULT_AGENT!r}) and its private workspace")
    for line in created:
        print(output.paint("created", "green") + f"  {line}")
    for line in kept:
        print(output.paint("kept", "dim") + f"     {line}")
    home_flag = "" if args.home is None else f" --home {home}"
    steps = [(f"secret set {provider.api_key} --value-stdin", f"the key of provider {name!r}, read from stdin")
             for name, provider in cfg.providers.items()]
    steps += [("up", "start the services in the background"),
              ("chat", f"talk to agent {DEFAULT_AGENT!r} in this terminal"),
              ("doctor", "check the setup")]
    width = max(len(command) for command, _ in steps)
    print()
    print("Next:")
    for command, why in steps:
        print(f"  starling{home_flag} {command.ljust(width)}   # {why}")
    if cfg.control.dashboard and not _has_accounts(paths):
        print(f"\nThe dashboard, once Starling is up: {dashboard_setup.link(paths, cfg)}\n  (a one-time link that makes"
              f" the first admin account; or `starling{home_flag} dashboard user add NAME`)")
    return 0


def _control_port() -> int:
    """The first free port from 7820, skipping those of the homes running here (each home has its own)."""
    taken = set()
    for entry in registry.running():
        port = entry.control.rpartition(":")[2]
        if port.isdigit():
            taken.add(int(port))
    return ports.free_control_port(taken=taken)


def _has_accounts(paths) -> bool:
    """Whether the dashboard has an account already (a home made before): then no setup link is made."""
    if not paths.db_file.exists():
        return False
    from common import db
    from common.stores import dashboard_store

    try:
        conn = db.open_reader(paths.db_file)
        try:
            with db.read_tx(conn):
                return dashboard_store.account_count(conn) > 0
        finally:
            conn.close()
    except Exception:  # noqa: BLE001 - an old schema or a damaged file: doctor says so; no link then
        return True
