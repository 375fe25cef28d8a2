"""`python -m services.scheduler`: the cron scheduler (a placeholder until the scheduler issue lands)."""

import sys

from common.runtime import run_placeholder

sys.exit(run_placeholder("scheduler", "the cron scheduler"))
