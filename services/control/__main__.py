"""`python -m services.control`: the health endpoint and the control API."""

import sys

from common import lean

# not lean.without_openssl(): the MCP SDK it serves /mcp with needs ssl (its initialize fails without)
lean.quiet_imports()

from services.control.main import main  # noqa: E402 - after lean

sys.exit(main())
