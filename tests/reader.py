"""A reader process for WAL tests: polls the turn count in short read transactions.

`python -m tests.reader DB_FILE SECONDS OUT_JSON` writes {"reads", "max_count", "went_back", "errors"}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from common import db
from common.stores import turn_store


def main(db_file: Path, seconds: float, out: Path) -> int:
    conn = db.open_reader(db_file)
    reads = went_back = 0
    last = 0
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with db.read_tx(conn):
                count = turn_store.count(conn)
        except Exception as exc:  # recorded, the test asserts there were none
            errors.append(repr(exc))
            continue
        reads += 1
        went_back += count < last
        last = max(last, count)
        time.sleep(0.005)
    out.write_text(json.dumps({"reads": reads, "max_count": last, "went_back": went_back, "errors": errors[:5]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])))
