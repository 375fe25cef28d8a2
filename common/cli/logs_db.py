"""`starling logs --db`: the warnings and errors every service sent to the ``daemon_log`` table (through
the writer), read from the database, so they show with no access to the log files."""

from __future__ import annotations

import argparse
import json
from datetime import datetime, timezone

from common import db
from common.cli import output
from common.cli.context import Context
from common.stores import dashboard_store

LEVELS = (("warning", 30), ("error", 40), ("critical", 50))
DEFAULT_LINES = 50


def _since(value) -> float:
    """--since as `starling logs` parses it (an ISO UTC time), or 0 for every row."""
    if not value:
        return 0.0
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()


def as_json_line(row: dashboard_store.LogRow) -> str:
    """A row as the JSON line the service logged (its ts, level, service, event, then the other keys)."""
    try:
        detail = json.loads(row.detail)
    except ValueError:
        detail = {"detail": row.detail}
    ts = datetime.fromtimestamp(row.at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({"ts": ts, "level": row.level, "service": row.service, "event": row.event,
                       **(detail if isinstance(detail, dict) else {"detail": detail})})


def show(args: argparse.Namespace) -> int:
    from common.cli.logs_cmd import render

    ctx = Context.from_args(args)
    threshold = getattr(args, "level", None) or 30
    levels = tuple(name for name, number in LEVELS if number >= threshold) or ("critical",)
    limit = getattr(args, "lines", None) or DEFAULT_LINES
    conn = ctx.reader()
    try:
        with db.read_tx(conn):
            rows = dashboard_store.log_lines(conn, _since(getattr(args, "since", None)), levels,
                                             (getattr(args, "service", None) or "").removesuffix(".log"), limit)
    finally:
        conn.close()
    if not rows:
        print("No warnings or errors in the database" + (" for that service" if getattr(args, "service", None) else "")
              + f" (kept {ctx.cfg.retention.audit_days} days).")
        return 0
    colour = output.use_colour()
    for row in reversed(rows):  # oldest first, as a log reads
        line = as_json_line(row)
        print(line if getattr(args, "json", False) else render(line, row.service, colour))
    return 0

