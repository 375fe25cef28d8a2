"""What a service process leaves unloaded at start (OpenSSL where it speaks no TLS, unused extras), called first in __main__."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

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


class _AsyncioTlsOnImport:
    """A meta path finder for ``ssl`` alone, used once: it loads the real module, then gives it to the asyncio
    modules that were imported without it (they bound ``ssl = None``), so TLS connections work from then on."""

    def find_spec(self, name, path=None, target=None):
        if name != "ssl":
            return None
        sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module) -> None:
            load(module)
            for owner in ("asyncio.sslproto", "asyncio.base_events", "asyncio.selector_events"):
                imported = sys.modules.get(owner)
                if imported is not None and getattr(imported, "ssl", None) is None:
                    imported.ssl = module
            sslproto = sys.modules.get("asyncio.sslproto")
            if sslproto is not None and not hasattr(sslproto, "SSLAgainErrors"):
                sslproto.SSLAgainErrors = (module.SSLWantReadError, module.SSLSyscallError)

        spec.loader.exec_module = exec_module
        return spec


@contextlib.contextmanager
def openssl_later() -> Iterator[None]:
    """While inside, OpenSSL is unimportable (asyncio, hashlib and hmac load without it); after, the first
    ``import ssl`` (aiohttp's, an SDK's: every TLS client imports it before it connects) loads it and gives
    asyncio its TLS support. For a process that may open TLS connections but not at start (a runner: its
    first model call); hashlib and hmac keep Python's builtin hashes."""
    with hidden(OPENSSL_MODULES):
        yield
    if "ssl" not in sys.modules:
        sys.meta_path.insert(0, _AsyncioTlsOnImport())


# Optional packages msgspec and structlog import when installed, for features Starling never uses:
# typing_extensions (msgspec: Starling's types all come from typing), greenlet (structlog's deprecated
# threadlocal module) and colorama (structlog's console renderer, for Windows). ~0.5 MB of RSS each process.
UNUSED_EXTRAS = ("typing_extensions", "greenlet", "colorama")


@contextlib.contextmanager
def hidden(names: tuple[str, ...]) -> Iterator[None]:
    """While inside: ``names`` (those not imported yet) are unimportable; importable again after, so what
    was imported meanwhile did without them and what comes later may load them."""
    hide = [name for name in names if name not in sys.modules]
    for name in hide:
        sys.modules[name] = None
    try:
        yield
    finally:
        for name in hide:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def quiet_imports() -> None:
    """Import msgspec and structlog with UNUSED_EXTRAS hidden; they stay importable afterwards for whoever
    needs them (aiohttp imports typing_extensions). Call first in __main__ (after without_openssl)."""
    with hidden(UNUSED_EXTRAS):
        import msgspec  # noqa: F401
        import structlog  # noqa: F401


def release_free_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's malloc_trim), once a service is ready:
    start-up (imports, the config, the first reads) leaves about 1 MB freed that free() keeps mapped.
    Only where ctypes is loaded already (the runners' sandbox probe, a spooling gateway's fallocate):
    loading it for this costs about what the trim gives back (bench/startup.py with ctypes loaded for it in
    every process: the same total). Nothing happens where the C library has no malloc_trim (musl)."""
    if "ctypes" not in sys.modules:
        return
    try:
        import ctypes

        trim = ctypes.CDLL(None).malloc_trim
    except (ImportError, OSError, AttributeError):
        return
    trim(0)


# Interpreter and C library settings for every Starling process: `starling up` puts them in supervisord's
# environment (supervisord and every program inherit them) and each systemd unit has them (deploy/systemd/);
# a value the operator's environment already sets wins. Measured with bench/startup.py: ~2 MB of RSS in all.
# PYTHONNODEBUGRANGES: code objects keep line numbers but not column ranges (~0.2 MB a process); the one
# difference is that tracebacks lose their ^^^^ markers under the failing expression.
# MALLOC_ARENA_MAX=2: glibc gives each thread that allocates (zmq's I/O thread, asyncio's executor thread) an
# arena of its own, each holding freed memory apart; one Python thread and a few helpers need no more than two.
PROCESS_ENVIRONMENT = {"PYTHONNODEBUGRANGES": "1", "MALLOC_ARENA_MAX": "2"}
