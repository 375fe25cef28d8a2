-- The dashboard (services/control/dashboard/): account roles, lockout after failed logins, and sessions.
-- A session row holds the SHA-256 of the cookie's token (never the token) and the
-- CSRF token its forms carry; it ends at expires_at, at logout, and with its account's password or the account.
ALTER TABLE dashboard_accounts ADD COLUMN role TEXT NOT NULL DEFAULT 'admin' CHECK (role IN ('admin', 'viewer'));
ALTER TABLE dashboard_accounts ADD COLUMN failed_logins INTEGER NOT NULL DEFAULT 0;
ALTER TABLE dashboard_accounts ADD COLUMN locked_until REAL NOT NULL DEFAULT 0;

CREATE TABLE dashboard_sessions (
    token_hash  TEXT PRIMARY KEY,
    account_id  INTEGER NOT NULL REFERENCES dashboard_accounts (id) ON DELETE CASCADE,
    csrf        TEXT NOT NULL,
    address     TEXT NOT NULL DEFAULT '',
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX dashboard_sessions_by_account ON dashboard_sessions (account_id);
CREATE INDEX dashboard_sessions_by_expiry ON dashboard_sessions (expires_at);

-- warnings and errors of every service, by service and time (the Logs page, `starling logs --db`)
CREATE INDEX daemon_log_by_service ON daemon_log (service, at);
