-- The sweeper: retention deletes in small steps, resets and session-memory captures.

-- A closed conversation is written to [session_memory] active_dir once; captured_at says it was
-- (or that it was passed over: nothing to write, or already past retention). NULL: not yet.
ALTER TABLE sessions ADD COLUMN captured_at REAL;
CREATE INDEX sessions_to_capture ON sessions (closed_at) WHERE state = 'closed' AND captured_at IS NULL;
-- daily and idle resets look for open conversations quiet since a time
CREATE INDEX sessions_open_by_activity ON sessions (last_active_at) WHERE state = 'open';
-- a conversation with a turn parked on an approval is neither reset nor deleted
CREATE INDEX turns_waiting ON turns (session_id) WHERE state = 'waiting';

-- Deleting a session or a turn makes SQLite find the rows that refer to it (ON DELETE CASCADE or
-- SET NULL); without these indexes each deleted row would scan the whole referring table.
CREATE INDEX outbox_by_session ON outbox (session_id);
CREATE INDEX outbox_by_turn ON outbox (turn_id);
CREATE INDEX usage_by_session ON usage (session_id);
CREATE INDEX approvals_by_session ON approvals (session_id);
CREATE INDEX jobs_by_session ON jobs (session_id);
CREATE INDEX skill_drafts_by_session ON skill_drafts (session_id);

-- Delivered and failed messages leave with their age; the tool audit leaves after audit_days.
CREATE INDEX outbox_done_by_age ON outbox (created_at) WHERE state IN ('sent', 'failed');
CREATE INDEX tool_executions_by_time ON tool_executions (created_at);

