"""`python -m services.scheduler`: the cron scheduler."""

import sys

from services.scheduler.main import main

sys.exit(main())
