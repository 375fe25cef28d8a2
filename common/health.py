"""Health of one home: service heartbeats, WAL size and free disk against the configured thresholds."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from common.config import Config
from common.home import Paths
from common.stores import beat_store

STALE_AFTER_BEATS = 3  # a service silent for this many heartbeat intervals is degraded
FORGET_AFTER_S = 24 * 3600  # a beat older than this is a service that no longer exists
DOWN_STATES = ("stopped",)
DISK_FULL = "disk_full"  # the writer's state while the data disk is full (services/writer/disk.py): down


def wal_bytes(db_file: Path) -> int:
    try:
        return os.stat(str(db_file) + "-wal").st_size
    except FileNotFoundError:
        return 0


def evaluate(paths: Paths, cfg: Config, beats: list[beat_store.Beat] | None, now: float | None = None) -> dict:
    """{"status": ok|degraded|down, "checks": {...}}; ``beats`` None means the database was unreadable."""
    now = now or time.time()
    interval = cfg.health.heartbeat_interval_ms / 1000
    checks: dict[str, dict] = {}
    down = degraded = False

    if beats is None:
        checks["database"] = {"status": "down", "detail": f"{paths.db_file} cannot be read"}
        down = True
        beats = []
    services = {}
    for beat in beats:
        age = now - beat.beat_at
        if age > FORGET_AFTER_S:
            continue
        stale = age > STALE_AFTER_BEATS * interval and beat.state not in DOWN_STATES
        status = "stale" if stale else beat.state
        services[beat.service] = {
            "status": status, "pid": beat.pid, "last_beat_s_ago": round(age, 1), "detail": beat.detail,
            "up_s": round(now - beat.started_at, 1),
        }
        if beat.service == "writer" and (stale or beat.state in DOWN_STATES or beat.state == DISK_FULL):
            down = True  # a writer that cannot store new messages is down, whatever else it still does
        elif stale:
            degraded = True
    if "writer" not in services and beats is not None and "database" not in checks:
        down = True
        services["writer"] = {"status": "missing", "detail": "the writer has never reported"}
    checks["services"] = {"status": "ok" if not down and not degraded else "degraded", "services": services}

    wal = wal_bytes(paths.db_file)
    wal_limit = cfg.health.wal_warn_threshold_mb * 1024 * 1024
    checks["wal"] = {"status": "ok" if wal <= wal_limit else "degraded", "bytes": wal, "threshold_bytes": wal_limit}
    degraded |= wal > wal_limit

    disk_limit = cfg.health.disk_warn_threshold_mb * 1024 * 1024
    disks = {}
    for label, folder in (("data_dir", paths.data_dir), ("agents_dir", paths.agents_dir),
                          ("workspace_dir", paths.workspace_dir)):
        try:
            free = shutil.disk_usage(folder).free
        except FileNotFoundError:
            free = 0
        disks[label] = {"path": str(folder), "free_bytes": free, "status": "ok" if free >= disk_limit else "degraded"}
        degraded |= free < disk_limit
    checks["disk"] = {"status": "ok" if all(d["status"] == "ok" for d in disks.values()) else "degraded",
                      "threshold_bytes": disk_limit, "folders": disks}

    status = "down" if down else "degraded" if degraded else "ok"
    return {"status": status, "checks": checks}


def public(report: dict) -> dict:
    """What /health shows without the control token: the status and each check's status, no detail
    (no pids, instance or bot names, paths, listen addresses, sizes)."""
    return {"status": report["status"],
            "checks": {name: {"status": check["status"]} for name, check in report["checks"].items()}}


def problems(report: dict) -> list[str]:
    """One line per failing check, for alerts."""
    lines = []
    checks = report["checks"]
    if "database" in checks:
        lines.append(checks["database"]["detail"])
    for name, svc in checks["services"]["services"].items():
        if svc["status"] in ("stale", "missing", "stopped") and (name == "writer" or svc["status"] == "stale"):
            lines.append(f"{name}: {svc['status']} ({svc.get('last_beat_s_ago', '-')}s since its last beat)")
        elif name == "writer" and svc["status"] == DISK_FULL:
            lines.append(f"writer: {svc.get('detail') or 'the data disk is full'}")
    if checks["wal"]["status"] != "ok":
        lines.append(f"WAL is {checks['wal']['bytes'] / 2**20:.1f} MB, over {checks['wal']['threshold_bytes'] / 2**20:.0f} MB")
    for label, disk in checks["disk"]["folders"].items():
        if disk["status"] != "ok":
            lines.append(f"{label} {disk['path']}: {disk['free_bytes'] / 2**20:.0f} MB free")
    return lines
