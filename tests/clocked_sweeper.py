"""`python -m tests.clocked_sweeper --home H`: the sweeper as production runs it, on the file clock of
tests/clocks.py when ``$STARLING_SWEEPER_CLOCK`` names one (the wall clock otherwise)."""

import os
import sys

from services.sweeper.main import main
from tests.clocks import SWEEPER_ENV, FileTime

if __name__ == "__main__":
    path = os.environ.get(SWEEPER_ENV)
    sys.exit(main(clock=FileTime(path) if path else None))
