"""`python -m services.runner`: the agent runner."""

import sys

from common import lean

# OpenSSL loads at the runner's first TLS connection (its first model call), not at start (lean.openssl_later)
with lean.openssl_later():
    lean.quiet_imports()
    from services.runner.main import main

sys.exit(main())
