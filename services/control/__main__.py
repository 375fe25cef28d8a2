"""`python -m services.control`: the health endpoint and the control API."""

import sys

from services.control.main import main

sys.exit(main())
