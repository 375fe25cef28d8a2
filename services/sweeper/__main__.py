"""`python -m services.sweeper`: retention, session memory, WAL checkpoints and the health watch."""

import sys

from services.sweeper.main import main

sys.exit(main())
