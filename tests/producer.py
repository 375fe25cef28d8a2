"""A producer process for durability tests: streams inbound writes, logs each acked key to a file.

`python -m tests.producer HOME ID COUNT ACKED_FILE` sends COUNT writes with keys "p{ID}:{n}", at most
32 in flight, resending through writer restarts; exits 0 when every write was acked.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from schema import messages as m
from tests.procs import make_home


async def produce(home_root: Path, producer: int, count: int, acked_file: Path) -> int:
    home = make_home(root=home_root, keep_config=True)
    window = asyncio.Semaphore(32)
    with open(acked_file, "a", buffering=1) as out:
        async with home.client(f"producer{producer}", timeout_s=0.5, deadline_s=120) as client:

            async def one(n: int) -> None:
                key = f"p{producer}:{n}"
                async with window:
                    await client.call(m.Inbound(
                        agent="default", instance="test", chat=f"p{producer}-c{n % 7}", sender=f"u{producer}",
                        text=f"message {key} about retries", dedupe_keys=[key],
                    ))
                out.write(key + "\n")

            await asyncio.gather(*(one(n) for n in range(count)))
    return 0


if __name__ == "__main__":
    root, producer, count, acked = sys.argv[1:5]
    sys.exit(asyncio.run(produce(Path(root), int(producer), int(count), Path(acked))))
