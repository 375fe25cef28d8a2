-- Platform events a gateway passed over because the writer refused them for themselves (they fail
-- validation): kept whole, as the platform sent them, for the operator (`starling status`, doctor).
-- One row per event (its own id, when it has one): a gateway that dead-letters it again adds nothing.
CREATE TABLE dead_letters (
    id INTEGER PRIMARY KEY,
    platform TEXT NOT NULL,
    instance TEXT NOT NULL,
    event_key TEXT NOT NULL,
    reason TEXT NOT NULL,
    payload TEXT NOT NULL,
    received_at REAL NOT NULL,
    created_at REAL NOT NULL
);
CREATE UNIQUE INDEX dead_letters_by_event ON dead_letters (instance, event_key) WHERE event_key != '';
