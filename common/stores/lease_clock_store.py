"""The writer's lease clock, as persisted: where it stands, and the clock skew the operator accepted."""

from __future__ import annotations

from typing import NamedTuple

import apsw

DAY_S = 86400.0

GET = (
    "SELECT boot_id, boot_base, last_lease, last_wall, skew, confirmed_skew, updated_at FROM lease_clock WHERE id = 1"
)
PUT = (
    "INSERT INTO lease_clock (id, boot_id, boot_base, last_lease, last_wall, skew, confirmed_skew, updated_at)"
    " VALUES (1, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET boot_id = excluded.boot_id, boot_base = excluded.boot_base,"
    " last_lease = excluded.last_lease, last_wall = excluded.last_wall, skew = excluded.skew,"
    " confirmed_skew = excluded.confirmed_skew, updated_at = excluded.updated_at"
)
READING = (  # the confirmed skew is the operator's: a reading never changes it (only a first row sets it)
    "INSERT INTO lease_clock (id, boot_id, boot_base, last_lease, last_wall, skew, confirmed_skew, updated_at)"
    " VALUES (1, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET boot_id = excluded.boot_id, boot_base = excluded.boot_base,"
    " last_lease = excluded.last_lease, last_wall = excluded.last_wall, skew = excluded.skew,"
    " updated_at = excluded.updated_at"
)
CONFIRM = "UPDATE lease_clock SET skew = ?, confirmed_skew = ?, updated_at = ? WHERE id = 1"


class State(NamedTuple):
    boot_id: str
    boot_base: float
    last_lease: float
    last_wall: float
    skew: float  # wall - lease, as last seen
    confirmed_skew: float
    updated_at: float

    @property
    def jump_s(self) -> float:
        """How far the wall clock moved ahead of the lease clock since the operator last accepted it."""
        return self.skew - self.confirmed_skew

    @property
    def holds_retention(self) -> bool:
        return self.jump_s > DAY_S


def held_text(jump_s: float) -> str:
    """Why retention holds, for logs, alerts, refusals and `starling status`."""
    return (f"the wall clock is {jump_s / 3600:.1f} h ahead of the time the writer counted (a jump, or a host off"
            " that long); retention holds: nothing is deleted by age until an operator who checked the time runs"
            " `starling retention confirm-clock`")


def get(conn: apsw.Connection) -> State | None:
    row = conn.execute(GET).fetchone()
    return None if row is None else State(*row)


def put(conn: apsw.Connection, state: State) -> None:
    conn.execute(PUT, tuple(state))


def reading(conn: apsw.Connection, boot_id: str, boot_base: float, lease: float, wall: float,
            confirmed_if_new: float = 0.0) -> None:
    """Where the clock stands now (the operator's confirmed skew is kept)."""
    conn.execute(READING, (boot_id, boot_base, lease, wall, wall - lease, confirmed_if_new, wall))


def confirm(conn: apsw.Connection, skew: float, wall: float) -> None:
    """The operator accepts the wall clock as it is now: ``skew`` becomes the confirmed one."""
    conn.execute(CONFIRM, (skew, skew, wall))
