"""`python -m services.writer`: run the writer in the foreground."""

import sys

from common import lean

lean.without_openssl()  # no TLS, and the builtin sha256 (+0.7 µs a frame) signs its few frames a commit
lean.quiet_imports()

from services.writer.main import main  # noqa: E402 - after lean

sys.exit(main())
