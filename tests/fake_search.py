"""Fake web search APIs on 127.0.0.1 for web_search, checking requests as the real services do:

- SearXNG: ``GET /search?q=...&format=json``; without ``format=json`` it answers its HTML page, as an
  instance does; a format the instance does not serve is 403 (SearXNG's answer when json is not enabled);
  no ``q``: 400.
- Brave Search: ``GET /res/v1/web/search?q=...&count=N`` with ``X-Subscription-Token`` (401
  SUBSCRIPTION_TOKEN_INVALID without); ``q`` required, ``count`` 1..20 (422 VALIDATION).
- Tavily: ``POST /search`` with ``Authorization: Bearer tvly-...`` (401) and a JSON body whose ``query`` is
  required (400) and ``max_results`` 0..20.

Answers hold ``results`` made from the query (titles "Result N for <q>", URLs https://example.org/<n>), in
each service's own shape. ``requests`` records what was asked. Use in a test's loop: ``async with FakeSearch()
as fake: fake.url``.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.fake_server import listen

BRAVE_KEY = "BSA-fake-subscription-token"
TAVILY_KEY = "tvly-fake-key-123456"


def _results(q: str, n: int) -> list[dict[str, Any]]:
    return [{"title": f"Result {i} for {q}", "url": f"https://example.org/{i}", "text": f"snippet {i} about {q}"}
            for i in range(1, n + 1)]


class FakeSearch:
    def __init__(self, *, json_enabled: bool = True) -> None:
        self.json_enabled = json_enabled
        self.port = 0
        self.requests: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeSearch:
        app = web.Application()
        app.add_routes([web.get("/search", self._searxng), web.get("/res/v1/web/search", self._brave),
                        web.post("/search", self._tavily)])
        self._runner, self.port = await listen(app, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def _record(self, api: str, request: web.Request, body: Any = None) -> None:
        self.requests.append({"api": api, "query": dict(request.query), "body": body,
                              "headers": {k.lower(): v for k, v in request.headers.items()}})

    async def _searxng(self, request: web.Request) -> web.Response:
        self._record("searxng", request)
        q, fmt = request.query.get("q", ""), request.query.get("format", "html")
        if not q:
            return web.Response(status=400, text="Bad Request")
        if fmt == "html":
            return web.Response(text=f"<html><body><h1>{q}</h1></body></html>", content_type="text/html")
        if fmt != "json" or not self.json_enabled:
            return web.Response(status=403, text="Forbidden")
        results = [{"title": r["title"], "url": r["url"], "content": r["text"], "engine": "fake"}
                   for r in _results(q, 3)]
        return web.json_response({"query": q, "number_of_results": len(results), "results": results,
                                  "answers": [], "suggestions": [], "unresponsive_engines": []})

    async def _brave(self, request: web.Request) -> web.Response:
        self._record("brave", request)
        if request.headers.get("X-Subscription-Token") != BRAVE_KEY:
            return web.json_response({"type": "ErrorResponse", "error": {
                "code": "SUBSCRIPTION_TOKEN_INVALID", "detail": "The provided subscription token is invalid.",
                "status": 401}}, status=401)
        q, count = request.query.get("q", ""), request.query.get("count", "20")
        if not q or not count.isdigit() or not 1 <= int(count) <= 20:
            return web.json_response({"type": "ErrorResponse", "error": {
                "code": "VALIDATION", "detail": "Unable to validate request parameter(s)", "status": 422}}, status=422)
        results = [{"title": r["title"], "url": r["url"], "description": r["text"], "type": "search_result"}
                   for r in _results(q, int(count))]
        return web.json_response({"type": "search", "query": {"original": q}, "web": {"type": "search",
                                                                                     "results": results}})

    async def _tavily(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (ValueError, json.JSONDecodeError):
            body = None
        self._record("tavily", request, body)
        if request.headers.get("Authorization") != f"Bearer {TAVILY_KEY}":
            return web.json_response({"detail": {"error": "Unauthorized: missing or invalid API key."}}, status=401)
        if not isinstance(body, dict) or not isinstance(body.get("query"), str) or not body["query"]:
            return web.json_response({"detail": {"error": "Invalid request: query is required."}}, status=400)
        n = body.get("max_results", 5)
        if not isinstance(n, int) or not 0 <= n <= 20:
            return web.json_response({"detail": {"error": "max_results must be between 0 and 20."}}, status=400)
        results = [{"title": r["title"], "url": r["url"], "content": r["text"], "score": 0.9}
                   for r in _results(body["query"], n)]
        return web.json_response({"query": body["query"], "results": results, "response_time": 0.1})
