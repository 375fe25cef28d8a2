-- The sweeper removes finished cron runs past [retention] audit_days, oldest first (each job keeps
-- its latest run: the scheduler counts the next fires from it).
CREATE INDEX cron_runs_by_time ON cron_runs (scheduled_for);
