"""The programs a home's config asks for, named as `starling status` shows them: writer, runner-N,
scheduler, sweeper, control, and one per gateway process: gateway-<platform> for the instances without
a ``process``, gateway-<platform>-<NAME> for those with ``process = "NAME"``."""

from __future__ import annotations

from dataclasses import dataclass

from common.config import Config

PLATFORMS = ("telegram", "slack", "whatsapp")
SINGLETONS = ("writer", "scheduler", "sweeper", "control")


@dataclass(frozen=True)
class GatewayProgram:
    name: str  # gateway-telegram, gateway-telegram-NAME
    platform: str
    process: str  # "" for the platform's own program
    instances: tuple[str, ...]  # the instance ids it serves


def gateway_name(platform: str, process: str = "") -> str:
    return f"gateway-{platform}-{process}" if process else f"gateway-{platform}"


def gateway_programs(cfg: Config) -> list[GatewayProgram]:
    """Every gateway process the config asks for, the platform's own first, then by process name."""
    found: list[GatewayProgram] = []
    for platform in PLATFORMS:
        by_process: dict[str, list[str]] = {}
        for gw in getattr(cfg.gateways, platform):
            by_process.setdefault(gw.process, []).append(gw.id)
        for process in sorted(by_process):
            found.append(GatewayProgram(gateway_name(platform, process), platform, process,
                                        tuple(by_process[process])))
    return found


def serving(cfg: Config, platform: str, process: str) -> list:
    """The [[gateways.<platform>]] instances that the process named ``process`` serves."""
    return [gw for gw in getattr(cfg.gateways, platform) if gw.process == process]


def program_of_instance(cfg: Config, instance: str) -> str | None:
    """The program that serves a gateway instance id, or None when no instance has that id."""
    for platform in PLATFORMS:
        for gw in getattr(cfg.gateways, platform):
            if gw.id == instance:
                return gateway_name(platform, gw.process)
    return None


def runner_names(cfg: Config) -> list[str]:
    return [f"runner-{i}" for i in range(cfg.runner.processes)]


def expected_services(cfg: Config) -> list[str]:
    """Every program `up` starts and waits for, in start order: the writer first."""
    names = ["writer", *runner_names(cfg), "scheduler", "sweeper", "control"]
    return names + [g.name for g in gateway_programs(cfg)]


def kind(name: str) -> str:
    """A program's kind: writer, runner, scheduler, sweeper, control or gateway."""
    return name.split("-", 1)[0]
