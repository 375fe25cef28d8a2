-- The approval a queued message asks for (the runner's ParkTurn notice), so a gateway with buttons draws
-- them from this column instead of reading "/approve ID" out of the text; '' for every other message.
ALTER TABLE outbox ADD COLUMN approval_id TEXT NOT NULL DEFAULT '';
