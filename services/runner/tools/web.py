"""The web tools: web_fetch (a page as readable text) and web_search (when ``[web] search`` names a provider).

web_fetch is of the network approval class, as a shell command with ``network: true``: it asks the
person, and is free only for a host in the agent's ``web_allow`` (its config.toml; an entry covers its
subdomains). Approval mode ``auto`` never grants it: the call is refused with the way out (web_allow). A
redirect is followed when the call was approved by a person, or when its host is allowed too; every hop
meets the address rules of web_net.py (no private, loopback or link-local address unless
``[web] allow_networks`` says so). HTML becomes text with trafilatura (main content, tables, links kept
as Markdown), text and JSON are shown as they are, a PDF as its text; anything else is named, not shown.
The registry redacts the result and sends a long one to data/tool-output/ like any other.

web_search asks the configured provider's HTTP API (SearXNG's JSON API, Brave Search, Tavily) and lists
title, URL and snippet of each result. The operator chose and configured it, so it runs without asking;
what it finds is fetched with web_fetch, under that tool's rules.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from typing import Any
from urllib.parse import urlencode, urlsplit

import aiohttp

from common.config import Config
from common.errors import MissingSecret, StarlingError
from common.personas import load_settings
from common.secrets import resolve_secret
from services.runner.llm import ToolSpec
from services.runner.tools import web_net
from services.runner.tools.base import Refused, Tool, ToolContext, ToolError, ToolResult

MAX_TEXT = 200_000  # characters of a page kept before the registry bounds what the model sees
TEXT_TYPES = ("application/json", "application/xml", "application/javascript", "application/x-ndjson")
SEARCH_TIMEOUT_S = 20.0


def allowed_host(host: str, allow: list[str]) -> bool:
    """Whether ``host`` is one of ``allow`` or a subdomain of one (entries may be written as URLs or *.x)."""
    host = host.lower().rstrip(".")
    for entry in allow:
        domain = _domain(entry)
        if domain and (host == domain or host.endswith("." + domain)):
            return True
    return False


def _domain(entry: str) -> str:
    entry = entry.strip().lower()
    if "://" in entry:
        entry = urlsplit(entry).hostname or ""
    return entry.removeprefix("*.").strip(".").split("/")[0]


async def web_fetch(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    url = args["url"].strip()
    try:
        host = web_net.check_url(url)
    except web_net.Blocked as exc:
        raise Refused(str(exc)) from None
    allow = await asyncio.to_thread(_web_allow, ctx)
    by_person = ctx.approved and not ctx.auto_approved
    if not allowed_host(host, allow) and not by_person:
        if ctx.approved:  # approval mode auto: never a reason to open the network
            raise Refused(f"fetching {host} needs a person's approval (network access), and this agent's approval"
                          " mode is auto, which never grants it; the operator can add the domain to web_allow in"
                          " the agent's config.toml")
        return ToolResult(f"Fetching {url} needs the person's approval (network access); they have been asked."
                          " Wait for their answer.", outcome="needs_approval",
                          approval_reason=f"fetch {url} (network access)")

    def may_follow(next_url: str) -> str:
        next_host = web_net.check_url(next_url)
        if by_person or allowed_host(next_host, allow):
            return ""
        return (f"{url} redirects to {next_url}, whose host {next_host} is not in web_allow; fetch that URL"
                " to ask the person for it")

    web = ctx.cfg.web
    try:
        page = await web_net.fetch(url, max_bytes=web.max_kb * 1024, timeout_s=web.timeout_s,
                                   max_redirects=web.max_redirects, allowed=web_net.networks(web.allow_networks),
                                   may_follow=may_follow)
    except web_net.Blocked as exc:
        raise Refused(f"{url}: {exc}") from None
    text = await asyncio.to_thread(readable, page)
    return ToolResult(text, outcome="ok" if page.status < 400 else "error")


def _web_allow(ctx: ToolContext) -> list[str]:
    try:
        return list(load_settings(ctx.paths.agents_dir / ctx.agent).web_allow)
    except StarlingError:
        return []


def readable(page: web_net.Page) -> str:
    """The page as text for the model: a header (where it came from, status, type), then its content."""
    head = [f"URL: {page.url}", f"Status: {page.status}", f"Content-Type: {page.content_type or 'unknown'}"]
    if page.hops:
        head.append("Redirected from: " + " -> ".join(page.hops))
    kind = page.content_type.lower()
    if kind in ("text/html", "application/xhtml+xml") or (not kind and page.body.lstrip()[:1] == b"<"):
        title, text = _html(page)
        if title:
            head.append(f"Title: {title}")
    elif kind.startswith("text/") or kind in TEXT_TYPES or kind.endswith(("+json", "+xml")):
        text = page.body.decode(page.charset or "utf-8", "replace")
    elif kind == "application/pdf":
        text = _pdf(page.body)
    else:
        text = f"[{len(page.body)} bytes of {kind or 'unknown content'}: not text, not shown]"
    if page.truncated:
        head.append(f"(only the first {len(page.body) // 1024} KB were read: [web] max_kb)")
    return "\n".join(head) + "\n\n" + (text.strip()[:MAX_TEXT] or "(no text)")


def _html(page: web_net.Page) -> tuple[str, str]:
    import trafilatura

    html = page.body.decode(page.charset, "replace") if page.charset else page.body
    text = trafilatura.extract(html, url=page.url, output_format="markdown", include_links=True,
                               include_tables=True, favor_recall=True, deduplicate=True)
    if not text:  # no main content found (a short page, an app shell): all of its text then
        text = trafilatura.html2txt(html)
    found = re.search(rb"<title[^>]*>(.*?)</title>", page.body[:65536], re.I | re.S)
    title = " ".join(found.group(1).decode(page.charset or "utf-8", "replace").split())[:300] if found else ""
    return title, text or ""


def _pdf(body: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(body))
        return "\n\n".join((page.extract_text() or "").strip() for page in reader.pages[:50]) or "(a PDF without text)"
    except (PdfReadError, OSError, ValueError, KeyError, TypeError) as exc:
        return f"(a PDF that could not be read: {type(exc).__name__})"


# ---------------------------------------------------------------- web_search


def search_request(cfg: Config, query: str, count: int, key: str) -> tuple[str, str, dict, dict | None]:
    """(method, URL, headers, JSON body) of one search with the configured provider."""
    web = cfg.web
    base = web.base_url.rstrip("/")
    if web.search == "searxng":
        url = f"{base}/search?" + urlencode({"q": query, "format": "json"})
        return "GET", url, {"Accept": "application/json"}, None
    if web.search == "brave":
        url = f"{base}/web/search?" + urlencode({"q": query, "count": str(count)})
        return "GET", url, {"Accept": "application/json", "X-Subscription-Token": key}, None
    return "POST", f"{base}/search", {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}, {
        "query": query, "max_results": count, "search_depth": "basic"}


def search_results(kind: str, data: Any) -> list[tuple[str, str, str]]:
    """(title, url, snippet) of each result in a provider's answer."""
    if not isinstance(data, dict):
        raise ToolError("the search service's answer was not a JSON object")
    if kind == "brave":
        items = (data.get("web") or {}).get("results") or []
        fields = ("title", "url", "description")
    else:  # searxng and tavily share the shape
        items = data.get("results") or []
        fields = ("title", "url", "content")
    out = []
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("url"), str):
            out.append(tuple(" ".join(str(item.get(f) or "").split()) for f in fields))
    return out


async def web_search(ctx: ToolContext, args: dict[str, Any]) -> ToolResult:
    web = ctx.cfg.web
    if not web.search:
        raise ToolError("no search provider is configured ([web] search in config.toml)")
    query, count = args["query"].strip(), int(args.get("count") or 5)
    if not query:
        raise ToolError("the query is empty")
    key = ""
    if web.api_key:
        try:
            key = resolve_secret(web.api_key, ctx.paths.secrets_file, key="web.api_key").strip()
        except MissingSecret:
            raise ToolError(f"the search key is not set (secret {web.api_key!r}; the operator sets it with"
                            f" `starling secret set {web.api_key} --value-stdin`)") from None
    method, url, headers, body = search_request(ctx.cfg, query, count, key)
    timeout = aiohttp.ClientTimeout(total=SEARCH_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(timeout=timeout, trust_env=False) as session:
            async with session.request(method, url, headers=headers, json=body) as resp:
                raw = await resp.content.read(2 * 1024 * 1024)
                if resp.status != 200:
                    said = raw[:300].decode("utf-8", "replace")
                    raise ToolError(f"the search service answered HTTP {resp.status}: {said}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ToolError(f"the search service could not be reached ({type(exc).__name__})") from None
    try:
        results = search_results(web.search, json.loads(raw))[:count]
    except ValueError:
        raise ToolError("the search service's answer was not JSON") from None
    if not results:
        return ToolResult(f"No results for {query!r}.")
    lines = [f"{i}. {title or url}\n   {url}" + (f"\n   {snippet[:400]}" if snippet else "")
             for i, (title, url, snippet) in enumerate(results, start=1)]
    return ToolResult(f"Results for {query!r} ({web.search}):\n" + "\n".join(lines))


TOOLS = [
    Tool(ToolSpec("web_fetch", "Fetch a web page (GET) and read it as text: the main content of an HTML page, a"
                  " text or JSON file as it is, a PDF's text. Asks the person first unless the site is one the"
                  " operator allowed.",
                  {"type": "object", "properties": {"url": {"type": "string", "description": "http:// or https://"}},
                   "required": ["url"], "additionalProperties": False}),
         "web", web_fetch, inline_limit=24 * 1024),
    Tool(ToolSpec("web_search", "Search the web; returns titles, URLs and snippets (read a result with web_fetch).",
                  {"type": "object", "properties": {
                      "query": {"type": "string"},
                      "count": {"type": "integer", "minimum": 1, "maximum": 10, "description": "results (default 5)"}},
                   "required": ["query"], "additionalProperties": False}),
         "web", web_search, offered=lambda cfg: bool(cfg.web.search)),
]
