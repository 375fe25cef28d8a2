-- A turn whose runner died while holding it (services/writer/lease_ops.py). ``crashes``: deaths of a
-- runner that held this turn alone, so they were this turn's doing (at turn_store.MAX_CRASHES it is
-- failed, the person told, the operator alerted, an audit row written). ``suspect``: its runner died
-- holding it among others, and which of them did it is not known. Either way it runs alone from then on
-- (a runner claims nothing beside it), so a second crash is known to be its own. Neither costs an attempt.
ALTER TABLE turns ADD COLUMN crashes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE turns ADD COLUMN suspect INTEGER NOT NULL DEFAULT 0;
