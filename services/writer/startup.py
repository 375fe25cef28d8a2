"""The writer's start: the database opened, checked (a quick_check bounded in time) and migrated, or
refused when it is damaged, not a database, or newer than this code, with one clear line and an exit
code that neither supervisord nor systemd restarts in a loop."""

from __future__ import annotations

import os
import sys
import time

import apsw

from common import db
from common.errors import DatabaseUnusable, SchemaTooNew, StarlingError
from common.home import write_private_file
from common.service import Service
from common.stores import schema_store

# EX_CONFIG (sysexits.h): restarting cannot help, the operator must act. supervisord.conf lists it in
# the writer's exitcodes (with autorestart = unexpected) and the systemd unit in RestartPreventExitStatus.
EXIT_REFUSED = 78
# A quick_check reads every page: on a large database it is cut short after this long (and said so),
# so that a boot never stalls for long; `starling doctor` runs it to the end.
QUICK_CHECK_S = 10.0
# supervisord judges the exit code only of a process that lived `startsecs` (1 s for the writer);
# an earlier exit is a failed start, retried. A refusal under supervisord waits out this much.
SUPERVISOR_STARTSECS_S = 1.0
REFUSAL_UPTIME_S = SUPERVISOR_STARTSECS_S + 0.5

REFUSALS = (DatabaseUnusable, SchemaTooNew)


def open_database(svc: Service) -> apsw.Connection:
    """The writer's connection, checked and migrated. Raises DatabaseUnusable or SchemaTooNew for a
    file Starling must not start on (nothing is written to it)."""
    db_file = svc.paths.db_file
    try:
        conn = db.open_writer(db_file, svc.cfg.writer.busy_timeout_ms)
    except db.UNUSABLE_ERRORS as exc:
        raise db.unusable(db_file, exc) from None
    try:
        _check(svc, conn)
        before, after = schema_store.migrate(
            conn, db_file, progress=lambda n, name: svc.log.info("migrating", migration=name))
    except db.UNUSABLE_ERRORS as exc:
        conn.close()
        raise db.unusable(db_file, exc) from None
    except BaseException:
        conn.close()
        raise
    if before != after:
        svc.log.info("migrated", schema_from=before, schema_to=after)
    db.refusal_file(db_file).unlink(missing_ok=True)  # an earlier refusal no longer holds
    return conn


def _check(svc: Service, conn: apsw.Connection) -> None:
    schema_store.check_not_newer(conn, svc.paths.db_file)
    started = time.monotonic()
    if db.check_database(conn, svc.paths.db_file, QUICK_CHECK_S):
        svc.log.info("quick_check_ok", seconds=round(time.monotonic() - started, 3))
    else:
        svc.log.warning("quick_check_cut_short", seconds=QUICK_CHECK_S,
                        note="the database is large; `starling doctor` checks it to the end")


def refuse(svc: Service, exc: StarlingError, started: float) -> int:
    """One fatal line in the log, the same on stderr, the reason kept for `status` and the other
    services; returns the exit code that is not restarted."""
    reason = str(exc)
    svc.log.critical("database_refused", db=str(svc.paths.db_file), error=reason, exit_code=EXIT_REFUSED)
    print(f"starling-writer: fatal: {reason}", file=sys.stderr, flush=True)
    try:
        write_private_file(db.refusal_file(svc.paths.db_file), reason.encode() + b"\n")
    except OSError as err:
        svc.log.warning("refusal_not_recorded", error=err.strerror)
    if os.environ.get("SUPERVISOR_ENABLED"):
        time.sleep(max(0.0, REFUSAL_UPTIME_S - (time.monotonic() - started)))
    return EXIT_REFUSED
