-- Starling's first schema: every table of DESIGN.md "SQLite". Times are unix seconds (REAL).
-- Work queues (turns, outbox) carry a state, a lease holder and a lease end: see DESIGN.md
-- "The rule of durability" (3).

CREATE TABLE sessions (
    id              INTEGER PRIMARY KEY,
    agent           TEXT NOT NULL,
    instance        TEXT NOT NULL,          -- gateway instance id, or "cli"
    chat            TEXT NOT NULL,
    title           TEXT NOT NULL DEFAULT '',
    summary         TEXT NOT NULL DEFAULT '',  -- compaction summary of older turns
    summary_upto    INTEGER NOT NULL DEFAULT 0, -- turns up to this id are represented by the summary
    state           TEXT NOT NULL DEFAULT 'open' CHECK (state IN ('open', 'closed')),
    created_at      REAL NOT NULL,
    last_active_at  REAL NOT NULL,
    closed_at       REAL,
    close_reason    TEXT NOT NULL DEFAULT ''
);
CREATE INDEX sessions_by_activity ON sessions (last_active_at);
CREATE INDEX sessions_by_chat ON sessions (agent, instance, chat);

-- The sender -> session map: the open conversation of one agent, gateway instance and chat.
CREATE TABLE session_map (
    agent       TEXT NOT NULL,
    instance    TEXT NOT NULL,
    chat        TEXT NOT NULL,
    session_id  INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    PRIMARY KEY (agent, instance, chat)
) WITHOUT ROWID;
CREATE INDEX session_map_by_session ON session_map (session_id);

CREATE TABLE turns (
    id               INTEGER PRIMARY KEY,
    session_id       INTEGER NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    parent_id        INTEGER,   -- the user turn an answer, tool call or tool result belongs to; NULL for user turns
    role             TEXT NOT NULL CHECK (role IN ('user', 'assistant', 'tool', 'system', 'summary')),
    content          TEXT NOT NULL DEFAULT '',
    sender           TEXT NOT NULL DEFAULT '',
    sender_name      TEXT NOT NULL DEFAULT '',
    platform_msg_id  TEXT NOT NULL DEFAULT '',
    reply_to         TEXT NOT NULL DEFAULT '',
    attachments      TEXT NOT NULL DEFAULT '[]',   -- JSON list of paths under data/attachments
    meta             TEXT NOT NULL DEFAULT '{}',   -- JSON object (tool call ids, platform details)
    -- work state of an inbound turn; NULL for turns that are not work (answers, tool results);
    -- waiting: parked until a person decides an approval, then pending again
    state            TEXT CHECK (state IN ('pending', 'claimed', 'waiting', 'done', 'failed')),
    lease_owner      TEXT,
    lease_until      REAL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    error            TEXT NOT NULL DEFAULT '',
    created_at       REAL NOT NULL,
    done_at          REAL
);
CREATE INDEX turns_by_session ON turns (session_id, id);
-- conversation order: each user turn followed by what answered it, whatever arrived in between
CREATE INDEX turns_conversation ON turns (session_id, coalesce(parent_id, id), id);
CREATE INDEX turns_work ON turns (state, session_id, id) WHERE state IN ('pending', 'claimed');

-- Platform event ids already stored (update ids, (chat, message id) pairs, wamids, envelope ids).
CREATE TABLE inbound_keys (
    key         TEXT PRIMARY KEY,
    turn_id     INTEGER NOT NULL,
    created_at  REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX inbound_keys_by_age ON inbound_keys (created_at);

-- Answers of applied write requests by idempotency key: a replay returns the first answer.
CREATE TABLE write_keys (
    key         TEXT PRIMARY KEY,
    result      BLOB NOT NULL,
    created_at  REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX write_keys_by_age ON write_keys (created_at);

CREATE TABLE outbox (
    id               INTEGER PRIMARY KEY,
    session_id       INTEGER REFERENCES sessions (id) ON DELETE SET NULL,
    turn_id          INTEGER REFERENCES turns (id) ON DELETE SET NULL,
    instance         TEXT NOT NULL,
    chat             TEXT NOT NULL,
    kind             TEXT NOT NULL DEFAULT 'text' CHECK (kind IN ('text', 'file')),
    body             TEXT NOT NULL DEFAULT '',
    file_path        TEXT NOT NULL DEFAULT '',
    reply_to         TEXT NOT NULL DEFAULT '',
    state            TEXT NOT NULL DEFAULT 'pending'
                     CHECK (state IN ('pending', 'claimed', 'sent', 'failed')),
    lease_owner      TEXT,
    lease_until      REAL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    not_before       REAL NOT NULL DEFAULT 0,     -- retry backoff
    error            TEXT NOT NULL DEFAULT '',
    platform_msg_id  TEXT NOT NULL DEFAULT '',
    delivery         TEXT NOT NULL DEFAULT '',    -- platform delivery status: sent, delivered, read, failed
    created_at       REAL NOT NULL,
    sent_at          REAL
);
CREATE INDEX outbox_work ON outbox (instance, state, chat, id) WHERE state IN ('pending', 'claimed');
CREATE INDEX outbox_by_platform_id ON outbox (platform_msg_id) WHERE platform_msg_id != '';

CREATE TABLE tool_executions (
    id           INTEGER PRIMARY KEY,
    session_id   INTEGER REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id      INTEGER,
    agent        TEXT NOT NULL,
    tool         TEXT NOT NULL,
    arguments    TEXT NOT NULL DEFAULT '{}',   -- JSON, secrets redacted
    outcome      TEXT NOT NULL CHECK (outcome IN ('ok', 'error', 'refused', 'denied', 'pending')),
    result_path  TEXT NOT NULL DEFAULT '',
    error        TEXT NOT NULL DEFAULT '',
    duration_ms  REAL NOT NULL DEFAULT 0,
    created_at   REAL NOT NULL
);
CREATE INDEX tool_executions_by_session ON tool_executions (session_id, id);

CREATE TABLE approvals (
    id          TEXT PRIMARY KEY,                -- short code the user types: /approve ID
    session_id  INTEGER REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id     INTEGER,
    agent       TEXT NOT NULL,
    tool        TEXT NOT NULL,
    arguments   TEXT NOT NULL DEFAULT '{}',
    reason      TEXT NOT NULL DEFAULT '',
    state       TEXT NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'approved', 'denied', 'expired')),
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    decided_at  REAL,
    decided_by  TEXT NOT NULL DEFAULT ''
);
CREATE INDEX approvals_pending ON approvals (state, expires_at) WHERE state = 'pending';

-- Standing grants: "always allow this" for one agent, tool and argument pattern.
CREATE TABLE grants (
    id          INTEGER PRIMARY KEY,
    agent       TEXT NOT NULL,
    tool        TEXT NOT NULL,
    pattern     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    created_by  TEXT NOT NULL DEFAULT '',
    UNIQUE (agent, tool, pattern)
);

CREATE TABLE sender_access (
    instance    TEXT NOT NULL,
    sender      TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('allowed', 'blocked')),
    created_at  REAL NOT NULL,
    created_by  TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (instance, sender)
) WITHOUT ROWID;

CREATE TABLE pairing_codes (
    code         TEXT PRIMARY KEY,
    instance     TEXT NOT NULL,
    sender       TEXT NOT NULL,
    chat         TEXT NOT NULL,
    sender_name  TEXT NOT NULL DEFAULT '',
    created_at   REAL NOT NULL,
    expires_at   REAL NOT NULL,
    approved_at  REAL
);
CREATE INDEX pairing_codes_by_instance ON pairing_codes (instance, expires_at);

CREATE TABLE jobs (
    id          INTEGER PRIMARY KEY,
    session_id  INTEGER REFERENCES sessions (id) ON DELETE SET NULL,
    agent       TEXT NOT NULL,
    command     TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'done', 'failed', 'killed')),
    pid         INTEGER,
    log_path    TEXT NOT NULL,
    exit_code   INTEGER,
    started_at  REAL NOT NULL,
    ended_at    REAL
);
CREATE INDEX jobs_by_state ON jobs (state, ended_at);

CREATE TABLE cron_jobs (
    id                    INTEGER PRIMARY KEY,
    name                  TEXT NOT NULL UNIQUE,
    schedule              TEXT NOT NULL DEFAULT '',   -- cron expression; '' for a one-shot job
    tz                    TEXT NOT NULL DEFAULT 'UTC',
    run_at                REAL,                       -- one-shot jobs: when
    prompt                TEXT NOT NULL,
    agent                 TEXT NOT NULL,
    deliver_instance      TEXT NOT NULL,
    deliver_chat          TEXT NOT NULL,
    enabled               INTEGER NOT NULL DEFAULT 1 CHECK (enabled IN (0, 1)),
    misfire_grace_s       REAL,                       -- NULL: derived from the period
    consecutive_failures  INTEGER NOT NULL DEFAULT 0,
    created_at            REAL NOT NULL,
    updated_at            REAL NOT NULL,
    created_by            TEXT NOT NULL DEFAULT ''
);

CREATE TABLE cron_runs (
    id             INTEGER PRIMARY KEY,
    job_id         INTEGER NOT NULL REFERENCES cron_jobs (id) ON DELETE CASCADE,
    scheduled_for  REAL NOT NULL,
    state          TEXT NOT NULL DEFAULT 'fired'
                   CHECK (state IN ('fired', 'ok', 'failed', 'skipped')),
    turn_id        INTEGER,
    started_at     REAL NOT NULL,
    ended_at       REAL,
    duration_ms    REAL,
    error          TEXT NOT NULL DEFAULT '',
    UNIQUE (job_id, scheduled_for)
);

CREATE TABLE skill_drafts (
    id          INTEGER PRIMARY KEY,
    agent       TEXT NOT NULL,
    name        TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    body        TEXT NOT NULL,
    state       TEXT NOT NULL DEFAULT 'draft' CHECK (state IN ('draft', 'accepted', 'rejected')),
    session_id  INTEGER REFERENCES sessions (id) ON DELETE SET NULL,
    created_at  REAL NOT NULL,
    decided_at  REAL
);

CREATE TABLE usage (
    id             INTEGER PRIMARY KEY,
    session_id     INTEGER REFERENCES sessions (id) ON DELETE SET NULL,
    turn_id        INTEGER,
    agent          TEXT NOT NULL,
    provider       TEXT NOT NULL,
    model          TEXT NOT NULL,
    input_tokens   INTEGER NOT NULL DEFAULT 0,
    output_tokens  INTEGER NOT NULL DEFAULT 0,
    cost_usd       REAL NOT NULL DEFAULT 0,
    created_at     REAL NOT NULL
);
CREATE INDEX usage_by_time ON usage (created_at);

CREATE TABLE audit (
    id          INTEGER PRIMARY KEY,
    at          REAL NOT NULL,
    actor       TEXT NOT NULL,          -- service, CLI user, agent id
    action      TEXT NOT NULL,
    target      TEXT NOT NULL DEFAULT '',
    detail      TEXT NOT NULL DEFAULT '{}'   -- JSON, secrets redacted
);
CREATE INDEX audit_by_time ON audit (at);

CREATE TABLE daemon_log (
    id       INTEGER PRIMARY KEY,
    at       REAL NOT NULL,
    service  TEXT NOT NULL,
    level    TEXT NOT NULL,
    event    TEXT NOT NULL,
    detail   TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX daemon_log_by_time ON daemon_log (at);

CREATE TABLE dashboard_accounts (
    id             INTEGER PRIMARY KEY,
    username       TEXT NOT NULL UNIQUE,
    password_hash  TEXT NOT NULL,
    created_at     REAL NOT NULL,
    last_login_at  REAL
);

-- Last heartbeat of each service process, for `starling status` and `/health`.
CREATE TABLE service_beats (
    service     TEXT PRIMARY KEY,
    pid         INTEGER NOT NULL,
    state       TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    started_at  REAL NOT NULL,              -- when this pid first reported
    beat_at     REAL NOT NULL,
    starts      INTEGER NOT NULL DEFAULT 1, -- pids seen under the current parent: restarts + 1
    parent_pid  INTEGER NOT NULL DEFAULT 0  -- supervisord's pid; a new parent (a new `up`) restarts the count
) WITHOUT ROWID;

-- Recall: full-text over every turn, kept by triggers, ranked by bm25.
CREATE VIRTUAL TABLE turns_fts USING fts5 (
    content,
    content = 'turns',
    content_rowid = 'id',
    tokenize = 'porter unicode61'
);
CREATE TRIGGER turns_fts_insert AFTER INSERT ON turns BEGIN
    INSERT INTO turns_fts (rowid, content) VALUES (new.id, new.content);
END;
CREATE TRIGGER turns_fts_delete AFTER DELETE ON turns BEGIN
    INSERT INTO turns_fts (turns_fts, rowid, content) VALUES ('delete', old.id, old.content);
END;
CREATE TRIGGER turns_fts_update AFTER UPDATE OF content ON turns BEGIN
    INSERT INTO turns_fts (turns_fts, rowid, content) VALUES ('delete', old.id, old.content);
    INSERT INTO turns_fts (rowid, content) VALUES (new.id, new.content);
END;
