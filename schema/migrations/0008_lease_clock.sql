-- The writer's lease clock (services/writer/lease_clock.py): leases, retry times and workers' signs of
-- life are judged on it, never on the wall clock. One row: on host boot ``boot_id`` the lease clock
-- reads ``boot_base`` + CLOCK_BOOTTIME; ``last_lease``/``last_wall`` are its last reading and the wall
-- clock's at that moment (a writer on a new host boot goes on from there); ``skew`` is wall - lease as
-- last seen, ``confirmed_skew`` the skew the operator accepted (`starling retention confirm-clock`):
-- while skew - confirmed_skew is over a day, the wall clock jumped forward unconfirmed and retention holds.
CREATE TABLE lease_clock (
    id              INTEGER PRIMARY KEY CHECK (id = 1),
    boot_id         TEXT NOT NULL,
    boot_base       REAL NOT NULL,
    last_lease      REAL NOT NULL,
    last_wall       REAL NOT NULL,
    skew            REAL NOT NULL DEFAULT 0,
    confirmed_skew  REAL NOT NULL DEFAULT 0,
    updated_at      REAL NOT NULL
);
