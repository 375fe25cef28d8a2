"""web_fetch's way onto the network: one GET, its redirects, its caps, and the addresses it may reach.

Every hop (the URL and each redirect, at most ``max_redirects``) is checked before it is requested: http or
https only, no credentials in the URL, and a host whose every address is public. A name is resolved here
and the connection made to the very addresses that were checked (an aiohttp resolver of ours), so a DNS
answer that changes between the check and the connection (DNS rebinding) cannot lead anywhere else; an
address literal (``http://127.0.0.1/``, ``http://[::1]/``, ``http://0x7f000001/``) is judged the same way.
Loopback, private, link-local, shared, multicast and reserved addresses are refused unless they lie in
``[web] allow_networks``. A name with one refused address among public ones is refused whole.

Caps: ``timeout_s`` for the whole fetch with every hop, ``max_bytes`` of body read (after decompression;
the rest is not read, and the page says it was cut). No proxy from the environment, no cookies kept.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass, field
from typing import Awaitable, Callable
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver

REDIRECTS = (301, 302, 303, 307, 308)
USER_AGENT = "Mozilla/5.0 (compatible; Starling web_fetch)"
ACCEPT = "text/html,application/xhtml+xml,text/plain;q=0.9,application/json;q=0.9,*/*;q=0.5"

Net = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> [(family, address)]: the system's resolver unless a test gives its own
Lookup = Callable[[str, int], Awaitable[list[tuple[int, str]]]]


class Blocked(Exception):
    """A hop web_fetch will not make; the message says why, for the model."""


@dataclass
class Page:
    url: str  # where the body came from, after redirects
    status: int
    content_type: str
    charset: str
    body: bytes
    truncated: bool
    hops: list[str] = field(default_factory=list)  # the URLs that redirected here, in order


def networks(cidrs: list[str]) -> list[Net]:
    return [ipaddress.ip_network(c, strict=False) for c in cidrs]


def refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, allowed: list[Net]) -> str:
    """Why web_fetch may not connect to ``ip`` ("" when it may)."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if any(ip.version == net.version and ip in net for net in allowed):
        return ""
    for test, what in (("is_loopback", "a loopback address"), ("is_link_local", "a link-local address"),
                       ("is_multicast", "a multicast address"), ("is_unspecified", "an unspecified address"),
                       ("is_private", "a private address")):
        if getattr(ip, test):
            return what
    return "" if ip.is_global else "not a public address"


def literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``host`` as an address when it is written as one, in any form the C library reads (0x7f000001, 2130706433)."""
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        pass
    try:
        return ipaddress.ip_address(socket.inet_aton(host))  # what getaddrinfo would make of "127.1" or "0x7f.1"
    except OSError:
        return None


def check_url(url: str) -> str:
    """The URL's host (lower-case); Blocked when web_fetch does not request URLs of its kind."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Blocked(f"{url!r} is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise Blocked(f"only http:// and https:// URLs are fetched, not {parts.scheme or 'a URL without a scheme'}")
    if not parts.hostname:
        raise Blocked(f"{url!r} has no host")
    if parts.username is not None or parts.password is not None:
        raise Blocked("URLs with a user name or password in them are not fetched")
    if port == 0:
        raise Blocked("port 0 is not a port")
    return parts.hostname.lower().rstrip(".")


async def _system_lookup(host: str, port: int) -> list[tuple[int, str]]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, sockaddr[0]) for family, _t, _p, _c, sockaddr in infos]


class GuardedResolver(AbstractResolver):
    """Resolves a name once, refuses it if any address is refused, and gives aiohttp only those addresses."""

    def __init__(self, allowed: list[Net], lookup: Lookup | None = None) -> None:
        self.allowed = allowed
        self.lookup = lookup or _system_lookup

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list[dict]:
        try:
            found = await self.lookup(host, port)
        except socket.gaierror as exc:
            raise Blocked(f"the host name {host!r} was not found ({exc.strerror})") from None
        if not found:
            raise Blocked(f"the host name {host!r} has no address")
        out = []
        for fam, address in found:
            ip = ipaddress.ip_address(address.split("%")[0])
            why = refusal(ip, self.allowed)
            if why:
                raise Blocked(f"{host} resolves to {ip}, {why}; web_fetch reaches public addresses only")
            out.append({"hostname": host, "host": str(ip), "port": port, "family": fam, "proto": 0,
                        "flags": socket.AI_NUMERICHOST})
        return out

    async def close(self) -> None:
        pass


async def fetch(url: str, *, max_bytes: int, timeout_s: float, max_redirects: int, allowed: list[Net],
                may_follow: Callable[[str], str] = lambda _url: "", lookup: Lookup | None = None) -> Page:
    """GET ``url``, following redirects that ``may_follow`` (returning why not, or "") and the address rules
    allow; Blocked with the reason otherwise."""
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(allowed, lookup), use_dns_cache=False,
                                     force_close=True, limit=1)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(10.0, timeout_s))
    hops: list[str] = []
    try:
        async with asyncio.timeout(timeout_s):
            async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False,
                                             cookie_jar=aiohttp.DummyCookieJar()) as session:
                for hop in range(max_redirects + 1):
                    host = check_url(url)
                    ip = literal(host)
                    if ip is not None and (why := refusal(ip, allowed)):
                        raise Blocked(f"{host} is {why}; web_fetch reaches public addresses only")
                    if hop and (why := may_follow(url)):
                        raise Blocked(why)
                    async with session.get(url, allow_redirects=False, max_line_size=16384,
                                           headers={"User-Agent": USER_AGENT, "Accept": ACCEPT}) as resp:
                        location = resp.headers.get("Location")
                        if resp.status in REDIRECTS and location:
                            hops.append(url)
                            url = urljoin(url, location)
                            continue
                        body, truncated = await _read(resp, max_bytes)
                        return Page(str(resp.url), resp.status, resp.content_type or "", resp.charset or "", body,
                                    truncated, hops)
                raise Blocked(f"more than {max_redirects} redirects (the last to {url})")
    except TimeoutError:
        raise Blocked(f"no complete answer within {timeout_s:g} s") from None
    except aiohttp.ClientConnectorDNSError as exc:
        if isinstance(exc.os_error, Blocked):
            raise exc.os_error from None
        raise Blocked(f"the host name was not found ({exc.os_error})") from None
    except aiohttp.ClientError as exc:
        inner = getattr(exc, "os_error", None) or exc.__cause__
        if isinstance(inner, Blocked):
            raise inner from None
        raise Blocked(f"the request failed ({type(exc).__name__}: {exc})") from None


async def _read(resp: aiohttp.ClientResponse, cap: int) -> tuple[bytes, bool]:
    chunks, size = [], 0
    async for chunk in resp.content.iter_chunked(65536):
        if size + len(chunk) > cap:
            chunks.append(chunk[: cap - size])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False
