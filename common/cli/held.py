"""What Starling holds outside the flow of turns, for `starling status` and `starling doctor`: dead letters
(events passed over, kept whole: the dead_letters table and data/dead-letters/*.jsonl), the gateways'
spools (events acknowledged before the writer stored them: data/spool/*.spool) and the writer's disk
reserve (data/.reserve, gone while the data disk is full)."""

from __future__ import annotations

from dataclasses import dataclass, field

from common import db
from common.held_files import dead_letters_in_files, spool_sizes
from common.home import Paths
from common.stores import dead_letter_store

RESERVE_FILE = ".reserve"  # services/writer/disk.py BALLAST (common/ imports no service)


@dataclass
class Held:
    dead_letters: int | None = 0  # in the table (None: the database could not be read)
    dead_letter_files: int = 0    # in files, waiting for the writer to take them
    spools: dict[str, tuple[int, int]] = field(default_factory=dict)  # process -> (events, bytes)
    reserve: bool = False         # the disk reserve is in place

    def as_json(self) -> dict:
        return {"dead_letters": {"table": self.dead_letters, "files": self.dead_letter_files},
                "spools": {name: {"events": e, "bytes": b} for name, (e, b) in self.spools.items()},
                "reserve": self.reserve}

    def lines(self) -> list[str]:
        """What `status` says under its table (nothing when nothing is held)."""
        found = []
        kept = (self.dead_letters or 0) + self.dead_letter_files
        if kept:
            where = f" ({self.dead_letter_files} in {'a file' if self.dead_letter_files == 1 else 'files'} under"\
                    " data/dead-letters/)" if self.dead_letter_files else ""
            found.append(f"dead letters: {kept} events passed over, kept whole{where}; see `starling doctor`")
        for name, (events, size) in self.spools.items():
            if events:
                found.append(f"spool {name}: {events} events acknowledged, not yet stored ({size / 1024:.0f} KB)")
            elif size:
                found.append(f"spool {name}: empty ({size / 1024:.0f} KB)")
        return found


def read(paths: Paths) -> Held:
    held = Held(dead_letter_files=dead_letters_in_files(paths.dead_letters_dir),
                spools=spool_sizes(paths.spool_dir), reserve=(paths.data_dir / RESERVE_FILE).exists())
    if not paths.db_file.exists():
        return held
    try:
        reader = db.open_reader(paths.db_file)
        try:
            with db.read_tx(reader):
                held.dead_letters = sum(c.count for c in dead_letter_store.counts(reader))
        finally:
            reader.close()
    except Exception:  # noqa: BLE001 - an unmigrated or unreadable database: not known
        held.dead_letters = None
    return held
