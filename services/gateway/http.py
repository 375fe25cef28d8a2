"""HTTP pieces every platform client shares: the error for "no usable answer" and streamed downloads."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator, Callable, Mapping, NamedTuple

import aiohttp

from common.errors import StarlingError

DOWNLOAD_TIMEOUT_S = 300.0


class NetworkError(StarlingError):
    """No usable answer from a platform (connection refused, timeout, 5xx, not its API): worth a retry."""


class Answer(NamedTuple):
    status: int
    headers: Mapping[str, str]
    body: Any  # the JSON it held, or None when it was not JSON


async def request_json(session: aiohttp.ClientSession, method: str, url: str, *, what: str, timeout: float,
                       hide: Callable[[str], str] = lambda text: text, **kw: Any) -> Answer:
    """One call to a platform's API: no answer (a timeout, a refused connection) is a NetworkError; any
    answer comes back with its status, headers and JSON body for the platform's client to judge."""
    try:
        async with session.request(method, url, timeout=aiohttp.ClientTimeout(total=timeout), **kw) as resp:
            raw = await resp.read()
            status, headers = resp.status, resp.headers
    except asyncio.TimeoutError as exc:
        raise NetworkError(f"{what}: no answer within {timeout:.0f}s") from exc
    except aiohttp.ClientError as exc:
        raise NetworkError(f"{what}: {type(exc).__name__}: {hide(str(exc))}") from None
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    return Answer(status, headers, body)


async def download(session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None = None, *,
                   what: str = "download", hide: Callable[[str], str] = lambda text: text,
                   chunk: int = 65536) -> AsyncIterator[bytes]:
    """The body at ``url`` in chunks; anything but a 200 (a redirect to a sign-in page, an expired
    link) is a NetworkError. ``hide`` scrubs error texts (a token in the URL)."""
    try:
        async with session.get(url, headers=headers or {}, allow_redirects=False,
                               timeout=aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT_S)) as resp:
            if resp.status != 200:
                raise NetworkError(f"{what}: HTTP {resp.status}")
            async for piece in resp.content.iter_chunked(chunk):
                yield piece
    except asyncio.TimeoutError as exc:
        raise NetworkError(f"{what}: no answer in time") from exc
    except aiohttp.ClientError as exc:
        raise NetworkError(f"{what}: {hide(str(exc)) or type(exc).__name__}") from None
