"""`python -m services.writer`: run the writer in the foreground."""

import sys

from common import lean

lean.without_tls()  # it opens no TLS connection; it keeps OpenSSL's hashes for its frame rate
lean.quiet_imports()

from services.writer.main import main  # noqa: E402 - after lean

sys.exit(main())
