"""`python -m services.runner`: the agent runner."""

import sys

from services.runner.main import main

sys.exit(main())
