"""`python -m services.runner`: the agent runner (a placeholder until the runner issue lands)."""

import sys

from common.runtime import run_placeholder

sys.exit(run_placeholder("runner", "the agent runner"))
