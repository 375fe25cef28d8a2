"""Every benchmark's verdict: its targets checked and printed on one line, then the last line of output (one
JSON object with ``targets`` and ``targets_met``) and the exit status that goes with it: 1 when a target is
missed or a check of the run's correctness failed, 0 only when all held."""

from __future__ import annotations

import json
from typing import NamedTuple

__all__ = ["Target", "at_least", "below", "judge", "last_line"]


class Target(NamedTuple):
    name: str       # its key in the JSON's "targets"
    label: str      # how it is printed, e.g. "p99 < 20 ms"
    met: bool
    measured: str   # the figure it was judged on, as printed


def below(name: str, value: float, bound: float, unit: str = "", fmt: str = ".2f", label: str = "") -> Target:
    """``value < bound``."""
    return Target(name, label or f"{name} < {bound:g}{unit}", value < bound, f"{value:{fmt}}")


def at_least(name: str, value: float, bound: float, unit: str = "", fmt: str = ".2f", label: str = "") -> Target:
    """``value >= bound``."""
    return Target(name, label or f"{name} >= {bound:g}{unit}", value >= bound, f"{value:{fmt}}")


def judge(*targets: Target) -> dict[str, bool]:
    """Print one line saying which targets were met (each with its figure); return {name: met}."""
    print("targets: " + "; ".join(f"{t.label} {'met' if t.met else 'NOT met'} ({t.measured})" for t in targets),
          flush=True)
    return {t.name: t.met for t in targets}


def last_line(figures: dict, met: dict[str, bool], checks_ok: bool = True) -> int:
    """Print ``figures`` with "targets" ({name: met}) and "targets_met" as the last line; return the exit
    status: 0 when every target was met and ``checks_ok`` (the run's own checks: answers, rows, processes)."""
    targets_met = all(met.values())
    print(json.dumps({**figures, "targets": met, "targets_met": targets_met}), flush=True)
    return 0 if targets_met and checks_ok else 1
