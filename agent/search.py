"""``web_search``: an async tool on the AsyncBridge that asks a configured search engine and returns
its results (title, URL, snippet) for the model to read, follow with ``web_fetch`` and cite.

Engines (the operator configures one; its URL is trusted, so a self-hosted SearXNG on the local
network works, while every result URL the model then fetches goes through ``web_fetch``'s address
checks):

- ``searxng`` (default): ``GET {url}/search?q=…&format=json`` (SearXNG Search API). The instance
  must list ``json`` under ``search.formats`` in its ``settings.yml``; otherwise it answers 403,
  which is reported as such.
- ``brave``: ``GET https://api.search.brave.com/res/v1/web/search?q=…&count=N`` with the key in
  ``X-Subscription-Token`` (Brave Search API; results under ``web.results``).
- ``tavily``: ``POST https://api.tavily.com/search`` with ``{"query", "max_results"}`` and
  ``Authorization: Bearer <key>`` (Tavily Search API; results under ``results``).

A result's text is the engine's, i.e. untrusted: it is shown as data, control characters removed,
each field capped; only http(s) result URLs are kept.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

import aiohttp

from agent.bridge import AsyncBridge
from agent.tools import Tool

log = logging.getLogger("agent.search")

ENGINES = ("searxng", "brave", "tavily")
DEFAULT_URLS = {"brave": "https://api.search.brave.com/res/v1/web/search", "tavily": "https://api.tavily.com/search"}
TITLE_CHARS = 200
SNIPPET_CHARS = 500
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


class SearchError(RuntimeError):
    """The engine could not answer (HTTP error, not JSON, unknown shape); ``str`` says why, with
    no key in it."""


@dataclass(frozen=True)
class SearchResult:
    """One hit: ``url`` is absolute http(s); ``title`` and ``snippet`` are cleaned and capped."""

    title: str
    url: str
    snippet: str


def _clean(value: Any, limit: int) -> str:
    text = " ".join(_CONTROL.sub(" ", value if isinstance(value, str) else "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _results(items: Any, snippet_key: str, limit: int) -> list[SearchResult]:
    if not isinstance(items, list):
        raise SearchError("the engine's answer has no result list")
    out: list[SearchResult] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        url = item.get("url")
        if not isinstance(url, str) or not re.match(r"https?://[^\s]+$", url, re.IGNORECASE):
            continue
        out.append(SearchResult(_clean(item.get("title"), TITLE_CHARS) or url, url,
                                _clean(item.get(snippet_key), SNIPPET_CHARS)))
        if len(out) == limit:
            break
    return out


def format_results(query: str, engine: str, results: list[SearchResult]) -> str:
    """The tool result the model reads: a numbered list, then how to use it."""
    if not results:
        return f'No results for "{query}" ({engine}). Try other words, or say that nothing was found.'
    lines = [f'Search results for "{query}" ({engine}):']
    for number, result in enumerate(results, 1):
        lines.append(f"{number}. {result.title}\n   {result.url}")
        if result.snippet:
            lines.append(f"   {result.snippet}")
    lines.append("Snippets are short: open a result with web_fetch before relying on it, and cite the URL "
                 "of every result your answer uses.")
    return "\n".join(lines)


class WebSearch:
    """Holds the bridge-bound HTTP session. ``tool()`` returns the ``web_search`` Tool.

    Args:
        engine: ``searxng`` | ``brave`` | ``tavily``.
        url: the engine's endpoint (SearXNG: the instance's base URL; the others default to their
            public API).
        api_key: Brave's subscription token or Tavily's key (unused by SearXNG).
        max_results: results returned per search (1-20).
        language: a language code passed to the engine (``en``, ``zh-CN``), or ``None``.
        timeout_s: the whole request.

    Raises:
        ValueError: an unknown engine, no URL for SearXNG, or no key for Brave/Tavily.
    """

    def __init__(self, bridge: AsyncBridge, *, engine: str = "searxng", url: str | None = None,
                 api_key: str | None = None, max_results: int = 5, language: str | None = None,
                 timeout_s: float = 15.0) -> None:
        if engine not in ENGINES:
            raise ValueError(f"unknown search engine {engine!r} (one of {', '.join(ENGINES)})")
        url = url or DEFAULT_URLS.get(engine)
        if not url:
            raise ValueError("a SearXNG instance URL is needed (search.url)")
        if engine != "searxng" and not api_key:
            raise ValueError(f"the {engine} search API needs a key (search.api_key_env)")
        self._bridge = bridge
        self.engine = engine
        self._url = url.rstrip("/")
        self._key = api_key
        self._max = max(1, min(20, max_results))
        self._language = language
        self._timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s), cookie_jar=aiohttp.DummyCookieJar(),
                headers={"User-Agent": "agent-gateway/0.1 (+web_search)", "Accept": "application/json"})
            self._bridge.on_stop(self._session.close)
        return self._session

    async def search(self, query: str) -> str:
        """Searches for ``query`` and returns the formatted results.

        Raises:
            ValueError: an empty query.
            SearchError: the engine answered with an error or an unreadable body.
        """
        query = " ".join(query.split())
        if not query:
            raise ValueError("the query is empty")
        results = await self._ask(query[:400])
        return format_results(query[:400], self.engine, results)

    async def _ask(self, query: str) -> list[SearchResult]:
        session = await self._client()
        if self.engine == "searxng":
            params = {"q": query, "format": "json", "pageno": "1"}
            if self._language:
                params["language"] = self._language
            body = await self._json(session.get(f"{self._url}/search", params=params))
            return _results(body.get("results"), "content", self._max)
        if self.engine == "brave":
            params = {"q": query, "count": str(self._max)}
            if self._language:
                params["search_lang"] = self._language.split("-")[0]
            body = await self._json(session.get(self._url, params=params,
                                                headers={"X-Subscription-Token": self._key or ""}))
            web = body.get("web")
            return _results(web.get("results") if isinstance(web, dict) else [], "description", self._max)
        body = await self._json(session.post(self._url, json={"query": query, "max_results": self._max},
                                             headers={"Authorization": f"Bearer {self._key}"}))
        return _results(body.get("results"), "content", self._max)

    async def _json(self, request: Any) -> dict[str, Any]:
        try:
            async with request as response:
                if response.status == 403 and self.engine == "searxng":
                    raise SearchError("SearXNG answered 403: enable the JSON format (search.formats: "
                                      "[html, json] in its settings.yml)")
                if response.status in (401, 403):
                    raise SearchError(f"the {self.engine} search API refused the key (HTTP {response.status})")
                if response.status == 429:
                    raise SearchError(f"the {self.engine} search API is rate limited (HTTP 429); try again later")
                if response.status >= 400:
                    raise SearchError(f"the {self.engine} search engine answered HTTP {response.status}")
                try:
                    body = await response.json(content_type=None)
                except ValueError:
                    raise SearchError(f"the {self.engine} search engine did not answer JSON") from None
        except aiohttp.ClientError as exc:
            raise SearchError(f"the {self.engine} search engine is unreachable ({type(exc).__name__})") from None
        if not isinstance(body, dict):
            raise SearchError(f"the {self.engine} search engine's answer is not a JSON object")
        return body

    def tool(self) -> Tool:
        return Tool(
            name="web_search",
            description=(
                "Search the web and return the top results (title, URL, snippet). Use it for current "
                "events or facts you are unsure of; then open the best results with web_fetch and cite "
                "the URLs your answer relies on."
            ),
            parameters={
                "type": "object",
                "properties": {"query": {"type": "string", "description": "What to search for, in words."}},
                "required": ["query"],
                "additionalProperties": False,
            },
            fn=self.search,
            is_async=True,
            timeout_s=self._timeout_s + 5,
            side_effect="read",
            idempotent=True,
        )
