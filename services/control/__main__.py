"""`python -m services.control`: the health endpoint and the control API."""

import sys

from common import lean

lean.without_openssl()  # it opens no TLS connection
lean.quiet_imports()

from services.control.main import main  # noqa: E402 - after lean

sys.exit(main())
