"""`python -m common.supervisord_run -c FILE`: supervisord, started without OpenSSL (see common/lean.py).

supervisord speaks XML-RPC on a unix socket only; http.client and hashlib load OpenSSL if they can, ~4.5 MB
of RSS for a process that never opens a TLS connection. The module's name keeps "supervisord" in the command
line, which `starling status` and the pid registry look for.
"""

import sys

from common import lean

lean.without_openssl()

from supervisor import supervisord  # noqa: E402 - after lean

if __name__ == "__main__":
    sys.exit(supervisord.main())
