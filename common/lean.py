"""What a service process leaves unloaded at start: OpenSSL where it speaks no TLS (called first in __main__)."""

from __future__ import annotations

import sys

# asyncio, http.client and aiohttp import ssl only if they can; hashlib and hmac fall back to Python's
# builtin sha256/blake2 without _hashlib. Loading OpenSSL (libcrypto, libssl) costs ~4.5 MB of RSS per
# process, for nothing in one that never opens a TLS connection.
OPENSSL_MODULES = ("ssl", "_ssl", "_hashlib")


def without_openssl() -> None:
    """Make ``ssl`` and ``_hashlib`` unimportable in this process. Call before anything imports asyncio,
    hashlib or hmac; only in a process that opens no TLS connection and hashes little (the builtin
    sha256 is about half OpenSSL's speed). A module already imported is left as it is."""
    for name in OPENSSL_MODULES:
        sys.modules.setdefault(name, None)  # None in sys.modules: `import name` raises ImportError


def without_tls() -> None:
    """Make ``ssl`` unimportable (asyncio then builds no TLS support) but keep OpenSSL's fast hashes:
    for a process that signs every bus frame at a high rate (the writer)."""
    sys.modules.setdefault("ssl", None)
    sys.modules.setdefault("_ssl", None)


def release_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim), once a service is ready:
    start-up (imports, the config, the first reads) leaves about 1 MB freed that free() keeps mapped.
    Nothing happens where the C library has no malloc_trim (musl)."""
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):
        return
    trim(0)
