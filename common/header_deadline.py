"""A header read timeout for Starling's aiohttp servers (the gateways' webhooks, the control API): aiohttp
has none, so a client that trickles its request headers would hold a connection for ever."""

from __future__ import annotations

import asyncio
from typing import Callable

HEADER_TIMEOUT_S = 10.0  # platforms and the CLI send their headers at once; a trickle is cut


class HeaderDeadline(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection and aborts it when the first request's headers
    are not complete within ``timeout_s`` (aiohttp itself has no header read timeout)."""

    def __init__(self, inner: asyncio.Protocol, timeout_s: float, on_cut: Callable[[], None]) -> None:
        self._inner = inner
        self._timeout_s = timeout_s
        self._on_cut = on_cut
        self._timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._tail = b""  # the last bytes seen, to find the blank line across reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(self._timeout_s, self._cut)
        self._inner.connection_made(transport)

    def _cut(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            self._on_cut()
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if b"\n\r\n" in seen or b"\n\n" in seen:  # the blank line that ends the headers
                self._timer.cancel()
                self._timer = None
            else:
                self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()
