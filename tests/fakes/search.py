"""Fake search engines on loopback, as strict as the real APIs where it matters.

- ``FakeSearxng``: ``GET /search`` (SearXNG Search API): ``format=json`` is required (a real
  instance without ``json`` in ``search.formats`` answers 403), ``q`` must be non-empty (400);
  results are ``{"url", "title", "content", "engine"}``.
- ``FakeBrave``: ``GET /res/v1/web/search`` with ``X-Subscription-Token`` (else 401 with Brave's
  error body), ``q`` required (422), at most ``count`` results under ``web.results``.
- ``FakeTavily``: ``POST /search`` with ``Authorization: Bearer <key>`` (else 401), JSON body with
  ``query`` (400 without), ``max_results`` results under ``results``.

Each records the requests it served (``queries``). ``results`` maps a query to its hits; any other
query gets ``default``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes.server import ThreadedServer

Hit = dict[str, str]


class _FakeEngine(ThreadedServer):
    def __init__(self, results: dict[str, list[Hit]] | None = None, default: list[Hit] | None = None) -> None:
        super().__init__()
        self.results = results or {}
        self.default = default or []
        self.queries: list[dict[str, Any]] = []

    def hits(self, query: str) -> list[Hit]:
        return self.results.get(query, self.default)


class FakeSearxng(_FakeEngine):
    json_enabled = True

    def build_app(self) -> web.Application:
        async def search(request: web.Request) -> web.StreamResponse:
            self.queries.append(dict(request.query))
            if request.query.get("format") != "json" or not self.json_enabled:
                return web.Response(status=403, text="403 Forbidden")
            query = request.query.get("q", "").strip()
            if not query:
                return web.Response(status=400, text="No query")
            return web.json_response({"query": query, "number_of_results": len(self.hits(query)),
                                      "results": [{**hit, "engine": "fake"} for hit in self.hits(query)],
                                      "answers": [], "suggestions": [], "unresponsive_engines": []})

        app = web.Application()
        app.add_routes([web.get("/search", search)])
        return app


class FakeBrave(_FakeEngine):
    key = "BSA-fake-subscription-token"

    def build_app(self) -> web.Application:
        async def search(request: web.Request) -> web.StreamResponse:
            self.queries.append({**request.query, "token": request.headers.get("X-Subscription-Token")})
            if request.headers.get("X-Subscription-Token") != self.key:
                return web.json_response({"type": "ErrorResponse", "error": {
                    "code": "SUBSCRIPTION_TOKEN_INVALID", "detail": "The provided subscription token is invalid.",
                    "status": 401}}, status=401)
            query = request.query.get("q", "")
            if not query:
                return web.json_response({"type": "ErrorResponse", "error": {
                    "code": "VALIDATION", "detail": "Unable to validate request parameter(s)", "status": 422}},
                    status=422)
            count = int(request.query.get("count", "20"))
            hits = [{"title": h["title"], "url": h["url"], "description": h.get("content", "")}
                    for h in self.hits(query)[:count]]
            return web.json_response({"type": "search", "query": {"original": query}, "web": {
                "type": "search", "results": hits}})

        app = web.Application()
        app.add_routes([web.get("/res/v1/web/search", search)])
        return app


class FakeTavily(_FakeEngine):
    key = "tvly-fake-key"

    def build_app(self) -> web.Application:
        async def search(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            self.queries.append({**body, "auth": request.headers.get("Authorization")})
            if request.headers.get("Authorization") != f"Bearer {self.key}":
                return web.json_response({"detail": {"error": "Unauthorized: missing or invalid API key."}},
                                         status=401)
            if not isinstance(body, dict) or not body.get("query"):
                return web.json_response({"detail": {"error": "query is required"}}, status=400)
            hits = [{"title": h["title"], "url": h["url"], "content": h.get("content", ""), "score": 0.9}
                    for h in self.hits(body["query"])[: int(body.get("max_results", 5))]]
            return web.json_response({"query": body["query"], "answer": None, "results": hits,
                                      "response_time": 0.1})

        app = web.Application()
        app.add_routes([web.post("/search", search)])
        return app
