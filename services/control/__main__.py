"""`python -m services.control`: the health endpoint and the control API."""

import sys

from common import lean

# Started without OpenSSL: asyncio and aiohttp then build no TLS support (it serves plain HTTP and opens no
# TLS connection). Not lean.without_openssl(): the MCP SDK loads ssl at its first /mcp request, and must.
with lean.hidden(lean.OPENSSL_MODULES):
    lean.quiet_imports()
    from services.control.main import main

sys.exit(main())
