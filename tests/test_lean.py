"""common/lean.py: what a service leaves unloaded at start, and that what it defers still works when it comes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _python(code: str, *args: str) -> str:
    """What ``code`` prints in a fresh interpreter in the checkout (which must exit 0)."""
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout

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
    assert _python(SCRIPT, str(cert), str(key)).strip() == "over tls"


def test_runner_starts_without_openssl():
    """The runner's imports (its __main__'s) leave OpenSSL unloaded."""
    code = ("import sys\nfrom common import lean\nwith lean.openssl_later():\n    lean.quiet_imports()\n"
            "    from services.runner.main import main\n"
            "print(sorted(k for k in ('ssl', '_ssl', '_hashlib') if sys.modules.get(k) is not None))\n"
            # a module imported meanwhile that bound ssl = None would never do TLS: only asyncio's are mended later
            "print(sorted(n for n, mod in list(sys.modules.items()) if mod is not None and n not in"
            " ('asyncio.sslproto', 'asyncio.base_events', 'asyncio.selector_events')"
            " and getattr(mod, 'ssl', 1) is None))")
    stdout = _python(code)
    assert stdout.split("\n")[:2] == ["[]", "[]"], stdout
    assert "openssl_later" in (REPO / "services" / "runner" / "__main__.py").read_text()


def test_a_telegram_gateway_starts_without_ctypes_html_or_argparse_and_they_load_when_needed(tmp_path):
    """The spool's fallocate (ctypes, ctypes.util), the renderer's unescape (html) and argparse stay unloaded
    while a Telegram gateway starts; each still works at its first use."""
    code = f'''
import os, sys
from common import lean
lean.quiet_imports()
from services.gateway.base import main
from services.gateway.telegram.channel import TelegramChannel
from services.gateway import spool
from services.gateway.telegram import render
print(sorted(k for k in ("ctypes", "ctypes.util", "html", "html.entities", "argparse") if k in sys.modules))
print(render.to_plain('<b>a &amp; b</b> &lt;c&gt; &eacute;'))
print(render.to_html('[x](https://e.com/?a=1&b="2") `a<b` & c'))
path = {str(tmp_path / "f")!r}
with open(path, "wb") as f:
    f.write(b"x")
    f.flush()
    before = os.fstat(f.fileno()).st_blocks
    done = spool.allocate_ahead(f.fileno(), 1, 4 * 1024 * 1024)
    after = os.fstat(f.fileno())
print(done, after.st_size, after.st_blocks > before)
'''
    stdout = _python(code)
    loaded, plain, html, allocated = stdout.splitlines()
    assert loaded == "[]"
    assert plain == "a & b <c> é"
    assert html == '<a href="https://e.com/?a=1&amp;b=&quot;2&quot;">x</a> <code>a&lt;b</code> &amp; c'
    assert allocated in ("True 1 True", "False 1 False")  # False only where the file system cannot fallocate


def test_supervisord_starts_without_importlib_metadata():
    """common.supervisord_run imports supervisor with its stand-in for importlib.metadata: the rpcinterface
    factory of the config still loads, and the real module is importable afterwards."""
    code = ("import sys\nfrom common import supervisord_run\n"
            "print([k for k in ('importlib.metadata', 'csv', 'zipfile') if k in sys.modules])\n"
            "from supervisor import compat, rpcinterface\n"
            "print(compat.import_spec('supervisor.rpcinterface:make_main_rpcinterface')"
            " is rpcinterface.make_main_rpcinterface)\n"
            "print(compat.import_spec('os.path:join') is __import__('os').path.join)\n"
            "import importlib.metadata\nprint(importlib.metadata.EntryPoint.__module__)\n")
    stdout = _python(code)
    assert stdout.splitlines() == ["[]", "True", "True", "importlib.metadata"]


def test_every_process_gets_the_lean_environment(monkeypatch, tmp_path):
    """`starling up` gives supervisord (and so every program) lean.PROCESS_ENVIRONMENT under the operator's own
    values; every systemd unit sets the same, before its EnvironmentFile (which may override it)."""
    import os
    import types

    from common import lean
    from common import supervisor as sup

    line = "Environment=" + " ".join(f"{k}={v}" for k, v in lean.PROCESS_ENVIRONMENT.items())
    units = sorted((REPO / "deploy" / "systemd").glob("*.service"))
    assert len(units) == 6
    for unit in units:
        lines = unit.read_text().splitlines()
        assert line in lines, unit.name
        assert lines.index(line) < lines.index("EnvironmentFile=-/etc/starling/starling.env"), unit.name

    seen: dict[str, str] = {}

    def run(command, env, **_kw):
        seen.update(env)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(sup.supervisor_conf, "write", lambda paths, cfg: tmp_path / "supervisord.conf")
    monkeypatch.setattr(sup.subprocess, "run", run)
    monkeypatch.delenv("PYTHONNODEBUGRANGES", raising=False)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # the operator's
    paths = types.SimpleNamespace(home=tmp_path, data_dir=tmp_path / "data", run_dir=tmp_path / "data" / "run")
    umask = os.umask(0o022)
    try:
        sup.Supervisor(paths).start_daemon(None)
    finally:
        os.umask(umask)
    assert seen["PYTHONNODEBUGRANGES"] == "1" and seen["MALLOC_ARENA_MAX"] == "4"
    assert seen["STARLING_HOME"] == str(tmp_path)
