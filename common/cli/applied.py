"""The config the running services were started (or last reloaded) with: a copy of config.toml kept in
data/run/config.applied.toml by `up`, `restart` and `reload`, so a later command can say what changed."""

from __future__ import annotations

from pathlib import Path

from common import reload_plan
from common.cli.context import Context
from common.config import Config, load_config
from common.errors import StarlingError
from common.home import write_private_file


def applied_file(ctx: Context) -> Path:
    return ctx.paths.run_dir / "config.applied.toml"


def save(ctx: Context) -> None:
    write_private_file(applied_file(ctx), ctx.paths.config_file.read_bytes())


def load(ctx: Context) -> Config | None:
    """The applied config, or None when there is no copy (a home started by an older Starling)."""
    path = applied_file(ctx)
    if not path.exists():
        return None
    try:
        return load_config(path)
    except StarlingError:
        return None


def drift(ctx: Context) -> str:
    """For `up` on a running home: "" when config.toml is what runs, else what changed and what to run."""
    old = load(ctx)
    if old is None:
        return ("config.toml may have changed since the services started (no copy of the config they run"
                " with): `starling reload` applies it.")
    keys = reload_plan.changed_keys(old, ctx.cfg)
    if not keys:
        return ""
    shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
    return f"config.toml changed since the services started ({shown}): run `starling reload` to apply it."
