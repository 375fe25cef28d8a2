"""The webhook servers' limits over real sockets: slow headers cut, bodies bounded in size, time and
in how many are read before their signature is checked; and a real WhatsApp gateway that a flood
of unsigned 4 MB posts does not grow, and that still takes a signed webhook after it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import time

import pytest
from aiohttp import web

from common.log import get_logger
from services.gateway import webhook
from tests.fake_whatsapp import DEFAULT_APP_SECRET, DEFAULT_PHONE_NUMBER_ID, message_payload, sign
from tests.procs import wait_until
from tests.whatsapp_stack import OWNER, WhatsAppStack, free_port


class Server:
    """A WebhookServers with one signed route (the signature is the header "sig: good"), in a thread."""

    def __init__(self, **limits) -> None:
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.servers = webhook.WebhookServers(get_logger(test="webhook"), **limits)
        self.peak_reading = 0
        self.servers.route(f"127.0.0.1:{self.port}", "POST", "/hook", self.handle, owner="test")
        self.servers.route(f"127.0.0.1:{self.port}", "POST", "/trusted", self.trusted, owner="test")
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._pool.submit(self.loop.run_forever)
        self.run(self.servers.start())

    def run(self, coro, timeout: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def handle(self, request: web.Request) -> web.Response:
        raw = await self.servers.read_body(request)
        self.peak_reading = max(self.peak_reading, self.servers.reading)
        if request.headers.get("sig") != "good":
            return web.Response(status=401)
        return web.Response(text=f"got {len(raw)}")

    async def trusted(self, request: web.Request) -> web.Response:
        raw = await self.servers.read_body(request, verified=True)
        return web.Response(text=f"got {len(raw)}")

    def close(self) -> None:
        self.run(self.servers.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._pool.shutdown()
        self.loop.close()


@pytest.fixture
def server():
    s = Server(header_timeout_s=0.6, max_unverified=4, body_timeout_s=1.0)
    yield s
    s.close()


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    return sock


def head(path: str, length: int, sig: str = "good") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nsig: {sig}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def status_of(sock: socket.socket) -> int:
    answer = sock.recv(4096)
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True


def post(port: int, path: str = "/hook", body: bytes = b"{}", sig: str = "good") -> int:
    with connect(port) as sock:
        sock.sendall(head(path, len(body), sig) + body)
        return status_of(sock)


def test_headers_sent_one_byte_at_a_time_are_cut(server):
    request = head("/hook", 2)
    with connect(server.port) as sock:
        started = time.monotonic()
        cut = False
        for byte in request:  # 0.1 s a byte: the headers would take seconds
            try:
                sock.send(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            time.sleep(0.1)
        took = time.monotonic() - started
        assert cut or closed(sock)
    assert took < 3.0, f"a slowloris held the connection {took:.1f}s"
    assert server.servers.refused["slow_headers"] >= 1
    assert 200 == post(server.port)  # and the server serves the next comer


def test_slow_headers_of_a_later_request_on_a_kept_connection_are_cut(server):
    with connect(server.port) as sock:
        sock.sendall(head("/hook", 2) + b"{}")
        assert 200 == status_of(sock)
        sock.send(b"POST /hook HTTP/1.1\r\n")  # then nothing more: the keep-alive timer cuts it
        started = time.monotonic()
        assert closed(sock)
        assert time.monotonic() - started < 3.0


def test_a_declared_body_over_the_cap_is_refused_before_it_is_read(server):
    with connect(server.port) as sock:
        sock.sendall(head("/hook", webhook.MAX_BODY + 1))  # headers only: the answer needs no body
        assert 413 == status_of(sock)


def test_a_body_that_does_not_arrive_in_time_is_refused(server):
    with connect(server.port) as sock:
        sock.sendall(head("/hook", 1000) + b"{")
        started = time.monotonic()
        assert 408 == status_of(sock)
        assert time.monotonic() - started < 3.0


def test_unverified_bodies_read_at_once_are_capped_and_the_rest_answered_503_at_once(server):
    slow = [connect(server.port) for _ in range(10)]
    try:
        for sock in slow:  # ten bodies under way, none finished
            sock.sendall(head("/hook", 1_000_000, sig="forged") + b"x" * 1000)
        wait_until(lambda: server.servers.reading == 4, 5, what="4 bodies being read")
        started = time.monotonic()
        assert 503 == post(server.port, sig="forged")
        assert time.monotonic() - started < 1.0
        assert 200 == post(server.port, "/trusted")  # a verified request takes no unverified slot
        assert server.servers.refused["busy"] >= 7  # six of the ten, and the one above
    finally:
        for sock in slow:
            sock.close()
    assert server.peak_reading <= 4
    wait_until(lambda: server.servers.reading == 0, 5, what="the slots freed")
    assert 200 == post(server.port)


# ---------------------------------------------------------------- a real WhatsApp gateway


def _peak_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def _unsigned_post(port: int, body: bytes) -> int:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
            sock.settimeout(20)
            sock.sendall(f"POST /whatsapp/wa/webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         f"X-Hub-Signature-256: sha256={'0' * 64}\r\nContent-Length: {len(body)}\r\n\r\n".encode())
            sock.sendall(body)
            return status_of(sock)
    except OSError:  # cut while sending: refused all the same
        return -1


def _signed_post(port: int, payload: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.settimeout(20)
        sock.sendall(f"POST /whatsapp/wa/webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"X-Hub-Signature-256: {sign(payload, DEFAULT_APP_SECRET)}\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        return status_of(sock)


def test_a_flood_of_unsigned_4_mb_posts_does_not_grow_the_whatsapp_gateway():
    gateway = (f'[[gateways.whatsapp]]\nid = "wa"\nphone_number_id = "{DEFAULT_PHONE_NUMBER_ID}"\n'
               f'api_base = "{{API}}"\nlisten = "{{LISTEN}}"\nallow = ["+{OWNER}"]\n')
    s = WhatsAppStack(gateway=gateway)
    try:
        proc = s.start_gateway()
        before = _peak_rss_mb(proc.pid)
        body = b'{"object": "whatsapp_business_account", "pad": "' + b"x" * (webhook.MAX_BODY - 64) + b'"}'
        with concurrent.futures.ThreadPoolExecutor(60) as pool:
            statuses = list(pool.map(lambda _i: _unsigned_post(s.port, body), range(60)))
        assert all(code in (401, 503, -1) for code in statuses), statuses
        assert statuses.count(503) + statuses.count(-1) > 0  # the cap was met
        grown = _peak_rss_mb(proc.pid) - before
        # at most MAX_UNVERIFIED bodies (and aiohttp's copies of them) in memory at once, not sixty: about
        # 40 MB here, where the same flood without the cap grew it by 220 MB
        assert grown < 64, f"grew {grown:.0f} MB"
        deep = b"[" * 100_000 + b"]" * 100_000  # signed, and nested past json's recursion limit: skipped, no 500
        assert (200, 200) == (_signed_post(s.port, deep), _signed_post(s.port, json.dumps(
            message_payload(OWNER, "after the flood")).encode()))
        assert ["after the flood"] == s.user_turns("wa", OWNER)
        assert proc.alive()
    finally:
        s.stop()
