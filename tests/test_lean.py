"""common/lean.py: what a service leaves unloaded at start, and that what it defers still works when it comes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# In a fresh interpreter: asyncio, hashlib and hmac imported under openssl_later() load no OpenSSL; the first
# `import ssl` afterwards (as aiohttp does) gives asyncio its TLS support: a TLS echo over 127.0.0.1 works.
SCRIPT = r'''
import sys
from common import lean
with lean.openssl_later():
    import asyncio, hashlib, hmac
loaded = sorted(k for k in ("ssl", "_ssl", "_hashlib") if sys.modules.get(k) is not None)
assert not loaded, loaded
assert asyncio.sslproto.ssl is None
import aiohttp  # imports ssl: the finder loads it and hands it to asyncio
import ssl
assert asyncio.sslproto.ssl is ssl and asyncio.base_events.ssl is ssl and asyncio.selector_events.ssl is ssl
cert, key = sys.argv[1], sys.argv[2]

async def main():
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def echo(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=cert)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname="localhost"), 10)
    writer.write(b"over tls\n")
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    server.close()
    async with aiohttp.ClientSession() as session:  # aiohttp's own TLS path too
        server2 = await asyncio.start_server(echo, "127.0.0.1", 0, ssl=server_ctx)
        port2 = server2.sockets[0].getsockname()[1]
        connector_ctx = ssl.create_default_context(cafile=cert)
        try:
            await asyncio.wait_for(session.get(f"https://localhost:{port2}/", ssl=connector_ctx), 10)
        except aiohttp.ClientResponseError:
            pass
        except aiohttp.ClientError as exc:  # the echo is no HTTP server: a bad status line, after the handshake
            assert not isinstance(exc, aiohttp.ClientSSLError), exc
        server2.close()
    return line

print(asyncio.run(main()).decode().strip())
'''


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a test certificate")
def test_openssl_later_defers_openssl_and_tls_still_works(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(cert), str(key)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "over tls"


def test_runner_starts_without_openssl():
    """The runner's imports (its __main__'s) leave OpenSSL unloaded."""
    code = ("import sys\nfrom common import lean\nwith lean.openssl_later():\n    lean.quiet_imports()\n"
            "    from services.runner.main import main\n"
            "print(sorted(k for k in ('ssl', '_ssl', '_hashlib') if sys.modules.get(k) is not None))\n"
            # a module imported meanwhile that bound ssl = None would never do TLS: only asyncio's are mended later
            "print(sorted(n for n, mod in list(sys.modules.items()) if mod is not None and n not in"
            " ('asyncio.sslproto', 'asyncio.base_events', 'asyncio.selector_events')"
            " and getattr(mod, 'ssl', 1) is None))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "[]"], done.stdout
    assert "openssl_later" in (REPO / "services" / "runner" / "__main__.py").read_text()
