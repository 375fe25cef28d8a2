"""`python -m tests.clocked_scheduler --home H ...`: the scheduler as production runs it, on the file clock
of tests/clocks.py when ``$STARLING_TEST_CLOCK`` names one (the wall clock otherwise)."""

import os
import sys

from services.scheduler.main import main
from tests.clocks import SCHEDULER_ENV, FileClock

if __name__ == "__main__":
    path = os.environ.get(SCHEDULER_ENV)
    sys.exit(main(clock=FileClock(path) if path else None))
