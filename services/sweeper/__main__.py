"""`python -m services.sweeper`: the retention sweeper (a placeholder until the sweeper issue lands)."""

import sys

from common.runtime import run_placeholder

sys.exit(run_placeholder("sweeper", "the retention sweeper"))
