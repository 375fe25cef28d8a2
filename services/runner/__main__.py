"""`python -m services.runner`: the agent runner."""

import sys

from common import lean

lean.quiet_imports()

from services.runner.main import main  # noqa: E402 - after lean

sys.exit(main())
