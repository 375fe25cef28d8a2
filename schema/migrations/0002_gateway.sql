-- Gateways deliver one outbox row as several platform messages when it is long (Telegram: 4,096
-- UTF-16 units each). parts_sent records how many went out, so a gateway that dies mid-row resumes
-- at the next part instead of repeating the ones already delivered.
ALTER TABLE outbox ADD COLUMN parts_sent INTEGER NOT NULL DEFAULT 0;
