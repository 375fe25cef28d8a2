-- Who runs under each process name now (common/identity.py): a worker id unique to the process
-- (<name>@<host>/<boot>), its pid and the pid's start time, where that pid means it (pid_scope: host boot
-- and pid namespace), when it started (wall clock) and when it last showed it lives (seen: the writer's
-- lease clock). A newcomer under the name takes over only from a predecessor provably gone.
CREATE TABLE workers (
    name       TEXT PRIMARY KEY,
    worker     TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    pid_start  INTEGER NOT NULL DEFAULT 0,
    host       TEXT NOT NULL DEFAULT '',
    pid_scope  TEXT NOT NULL DEFAULT '',
    since      REAL NOT NULL,
    seen       REAL NOT NULL,
    state      TEXT NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'stopped'))
) WITHOUT ROWID;
