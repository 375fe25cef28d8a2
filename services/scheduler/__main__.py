"""`python -m services.scheduler`: the cron scheduler."""

import sys

from common import lean

lean.without_openssl()  # it opens no TLS connection
lean.quiet_imports()

from services.scheduler.main import main  # noqa: E402 - after lean

sys.exit(main())
