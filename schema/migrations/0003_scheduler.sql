-- The scheduler. active_since: fires of a job count from this time on (when it was added, or last
-- enabled); fires before it are neither run nor recorded as skipped. NULL: created_at.
-- disabled_reason: why a job is disabled ('' when enabled, or disabled by hand without a reason).
ALTER TABLE cron_jobs ADD COLUMN active_since REAL;
ALTER TABLE cron_jobs ADD COLUMN disabled_reason TEXT NOT NULL DEFAULT '';

-- Runs whose agent turn has not ended yet: the scheduler watches these until it records their outcome.
CREATE INDEX cron_runs_open ON cron_runs (job_id) WHERE state = 'fired';
