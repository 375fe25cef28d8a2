"""What a changed config.toml means for the running services: which take it in place on SIGHUP, which
are restarted, and what needs a full stop. `starling reload` and `starling up` on a running home use it.

In place (the service re-reads config.toml on SIGHUP; common/runtime.py):
- ``gateways.<platform>.<id>.allow``: the gateway process serving that instance;
- ``retention.*`` and ``session_memory.retention_days``: the sweeper;
- ``health.disk_warn_threshold_mb`` and ``health.wal_warn_threshold_mb``: the sweeper and control.
Everything else restarts the services that read it (a key this table does not know restarts them all),
``[runner] processes`` and a gateway's ``process`` add or remove programs, ``[backup]`` is read by the
CLI only, and a moved ``data_dir`` needs `starling down` with the old config first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from common.config import Config
from common.programs import PLATFORMS, SINGLETONS, gateway_name, gateway_programs, runner_names

IN_PLACE = {  # key prefix -> the kinds of service that apply it in place
    "retention.": ("sweeper",),
    "session_memory.retention_days": ("sweeper",),
    "health.disk_warn_threshold_mb": ("sweeper", "control"),
    "health.wal_warn_threshold_mb": ("sweeper", "control"),
}
RESTARTS = {  # key prefix -> the kinds of service that read it at start ("all": every service)
    "runner.processes": (),  # programs added or removed (supervisord's update)
    "runner.": ("runner",),
    "conversation.": ("runner",),
    "providers.": ("runner",),
    "tools.": ("runner",),
    "mcp.": ("runner",),
    "transcription.": ("runner", "gateway"),
    "scheduler.": ("scheduler",),
    "control.": ("control",),
    "writer.": ("writer",),
    "backup.": (),  # `starling backup` reads it; no service does
    "gateways.outbox_lease_s": ("gateway",),
}
NEEDS_DOWN = ("data_dir",)  # supervisord's socket, pid file and logs live there


def flatten(cfg: Config) -> dict[str, object]:
    """Every leaf of the config by dotted key; gateway instances by id (``gateways.telegram.main.allow``)."""
    raw = msgspec.to_builtins(cfg)
    for platform in PLATFORMS:
        raw["gateways"][platform] = {gw["id"]: gw for gw in raw["gateways"].get(platform, [])}
    flat: dict[str, object] = {}

    def walk(prefix: str, value: object) -> None:
        if isinstance(value, dict) and value:
            for key, item in value.items():
                walk(f"{prefix}{key}.", item)
        else:
            flat[prefix[:-1]] = value

    walk("", raw)
    return flat


def changed_keys(old: Config, new: Config) -> list[str]:
    a, b = flatten(old), flatten(new)
    return sorted(key for key in a.keys() | b.keys() if a.get(key, _MISSING) != b.get(key, _MISSING))


_MISSING = object()


@dataclass
class Plan:
    changed: list[str] = field(default_factory=list)  # the keys
    in_place: set[str] = field(default_factory=set)  # program names sent SIGHUP
    restart: set[str] = field(default_factory=set)  # program names restarted
    needs_down: list[str] = field(default_factory=list)  # keys no reload can apply


def _programs(cfg: Config) -> list[str]:
    return ["writer", *runner_names(cfg), "scheduler", "sweeper", "control", *(g.name for g in gateway_programs(cfg))]


def _of_kind(cfg: Config, kinds: tuple[str, ...]) -> set[str]:
    return {name for name in _programs(cfg) if name.split("-", 1)[0] in kinds}


def _serving(cfg: Config, platform: str, instance: str) -> set[str]:
    return {gateway_name(platform, gw.process) for gw in getattr(cfg.gateways, platform) if gw.id == instance}


def plan(old: Config, new: Config) -> Plan:
    """What to do for the change from ``old`` (what the services run with) to ``new`` (the file now).
    Program names are those of the new config; programs only in the old one are supervisord's to remove."""
    result = Plan(changed=changed_keys(old, new))
    every = set(_programs(new))
    for key in result.changed:
        if key in NEEDS_DOWN:
            result.needs_down.append(key)
            continue
        parts = key.split(".")
        if parts[0] == "gateways" and len(parts) >= 4 and parts[1] in PLATFORMS:
            platform, instance, leaf = parts[1], parts[2], parts[3]
            targets = (_serving(old, platform, instance) | _serving(new, platform, instance)) & every
            (result.in_place if leaf == "allow" else result.restart).update(targets)
            continue
        hot = next((kinds for prefix, kinds in IN_PLACE.items() if key.startswith(prefix)), None)
        if hot is not None:
            result.in_place |= _of_kind(new, hot)
            continue
        kinds = next((kinds for prefix, kinds in RESTARTS.items() if key.startswith(prefix)), None)
        result.restart |= every if kinds is None else _of_kind(new, kinds)
    result.in_place -= result.restart
    return result


def order(names: set[str] | list[str]) -> list[str]:
    """Program names in start order: writer, runners, singletons, gateways."""
    rank = {name: i for i, name in enumerate(SINGLETONS)}

    def key(name: str) -> tuple:
        kind = name.split("-", 1)[0]
        group = {"writer": 0, "runner": 1, "gateway": 3}.get(kind, 2)
        tail = name.rsplit("-", 1)[-1]
        return (group, rank.get(name, 0), int(tail) if kind == "runner" and tail.isdigit() else 0, name)

    return sorted(names, key=key)
