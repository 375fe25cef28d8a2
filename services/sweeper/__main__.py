"""`python -m services.sweeper`: retention, session memory, WAL checkpoints and the health watch."""

import sys

from common import lean

lean.without_openssl()  # it opens no TLS connection
lean.quiet_imports()

from services.sweeper.main import main  # noqa: E402 - after lean

sys.exit(main())
