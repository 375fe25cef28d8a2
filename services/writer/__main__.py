"""`python -m services.writer`: run the writer in the foreground."""

import sys

from services.writer.main import main

sys.exit(main())
