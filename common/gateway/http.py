"""HTTP pieces every platform client shares: the error for "no usable answer" and streamed downloads."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

import aiohttp

from common.errors import StarlingError

DOWNLOAD_TIMEOUT_S = 300.0


class NetworkError(StarlingError):
    """No usable answer from a platform (connection refused, timeout, 5xx, not its API): worth a retry."""


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
