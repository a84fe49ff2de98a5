"""``web_search`` (issue 22): a configured engine's results reach the model with their URLs, the
answer can cite them, ``web_fetch`` follows them under the address rules, and every engine's
errors become a clear tool result (never a key, never a crash).

End to end: the real gateway with python-telegram-bot against the fake Telegram, the openai client
against the fake model, and a fake SearXNG (strict about ``format=json``). The engines' own
request shapes (Brave's header token, Tavily's bearer key) are checked against their fakes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from agent.bridge import AsyncBridge
from agent.search import SearchError, WebSearch
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.search import FakeBrave, FakeSearxng, FakeTavily
from tests.test_telegram_e2e import dm_update

HITS = [
    {"title": "Amber Falcon 2.0 released", "url": "https://news.example.org/amber-falcon-2",
     "content": "Version 2.0 ships the durable inbox."},
    {"title": "Amber Falcon changelog", "url": "https://amber.example.com/changelog",
     "content": "All changes since 1.0."},
    {"title": "not a web page", "url": "javascript:alert(1)", "content": "dropped"},
    {"title": "Tricky\u202eeman\x07", "url": "https://tricky.example.net/x", "content": "line\nbreak\x00here"},
]


@pytest.fixture(scope="module")
def searxng() -> Iterator[FakeSearxng]:
    with FakeSearxng(default=HITS) as fake:
        yield fake


@pytest.fixture(scope="module")
def bridge() -> Iterator[AsyncBridge]:
    bridge = AsyncBridge()
    bridge.start()
    yield bridge
    bridge.stop()


def _tool_result(request: dict[str, Any]) -> str:
    message = request["messages"][-1]
    assert message["role"] == "tool"
    return message["content"]


def _cite_first_result(request: dict[str, Any]) -> oa.Reply:
    """Answers like a model that read the results: with the first result's URL as its source."""
    urls = re.findall(r"https?://\S+", _tool_result(request))
    return oa.text(f"Version 2.0 shipped the durable inbox. Source: {urls[0]}")


async def test_a_search_turn_cites_a_url_from_the_engine(tmp_path, fake_telegram, fake_openai, searxng, running):
    fake_openai.reset()
    fake_openai.script(oa.tool_calls(oa.call("web_search", {"query": "amber falcon 2.0 release"})))
    fake_openai.responder = _cite_first_result
    config = gateway_config(tmp_path, fake_openai, fake_telegram, search={"url": searxng.url, "max_results": 2})
    await start_gateway(config, running)
    before = len(searxng.queries)
    fake_telegram.inject(dm_update("what is new in amber falcon 2.0?", 9801, user_id=5559801))
    sent = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5559801, timeout=15)
    assert "Source: https://news.example.org/amber-falcon-2" in sent.params["text"]
    assert searxng.queries[before:] == [{"q": "amber falcon 2.0 release", "format": "json", "pageno": "1"}]
    first = fake_openai.requests[0]["json"]
    assert "web_search" in [tool["function"]["name"] for tool in first["tools"]]
    result = _tool_result(fake_openai.requests[-1]["json"])
    assert "https://news.example.org/amber-falcon-2" in result and "https://amber.example.com/changelog" in result
    assert "javascript:" not in result  # only http(s) results are kept
    assert "https://tricky.example.net/x" not in result  # max_results = 2 counts kept results only


async def test_without_an_engine_the_tool_is_not_offered(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("no search here")
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(dm_update("hello", 9802, user_id=5559802))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5559802, timeout=15)
    assert "web_search" not in [tool["function"]["name"] for tool in fake_openai.requests[0]["json"]["tools"]]


async def test_a_result_url_is_fetched_under_the_address_rules(tmp_path, fake_telegram, fake_openai, running):
    """A result pointing into the private network is refused when the model opens it."""
    with FakeSearxng(default=[{"title": "admin", "url": "http://127.0.0.1:9/admin", "content": "x"}]) as engine:
        fake_openai.reset()
        fake_openai.script(oa.tool_calls(oa.call("web_search", {"query": "admin panel"})),
                           oa.tool_calls(oa.call("web_fetch", {"url": "http://127.0.0.1:9/admin"})))
        fake_openai.responder = lambda request: oa.text("could not open it")
        config = gateway_config(tmp_path, fake_openai, fake_telegram, search={"url": engine.url},
                                tools={"web_fetch_allow_private": False})
        await start_gateway(config, running)
        fake_telegram.inject(dm_update("find the admin panel", 9803, user_id=5559803))
        await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5559803, timeout=15)
    assert "refused 127.0.0.1: a loopback address" in _tool_result(fake_openai.requests[-1]["json"])


def test_results_are_cleaned_of_control_and_bidi_characters(bridge, searxng):
    search = WebSearch(bridge, url=searxng.url, max_results=10)
    text = bridge.run(search.search("  amber   falcon "), timeout=10)
    assert text.startswith('Search results for "amber falcon" (searxng):')
    assert "Tricky eman" in text and "\u202e" not in text and "\x07" not in text and "\x00" not in text
    assert "line break here" in text and "cite the URL" in text


def test_searxng_without_the_json_format_is_a_clear_error(bridge):
    with FakeSearxng(default=HITS) as engine:
        engine.json_enabled = False
        with pytest.raises(SearchError, match=r"SearXNG answered 403: enable the JSON format"):
            bridge.run(WebSearch(bridge, url=engine.url).search("x"), timeout=10)


def test_brave_sends_its_token_and_a_wrong_one_is_reported_without_it(bridge):
    with FakeBrave(default=HITS) as engine:
        brave = WebSearch(bridge, engine="brave", url=f"{engine.url}/res/v1/web/search", api_key=FakeBrave.key,
                          max_results=2)
        text = bridge.run(brave.search("amber falcon"), timeout=10)
        assert "https://news.example.org/amber-falcon-2" in text and "changelog" in text
        assert engine.queries[-1] == {"q": "amber falcon", "count": "2", "token": FakeBrave.key}
        wrong = WebSearch(bridge, engine="brave", url=f"{engine.url}/res/v1/web/search", api_key="BSA-wrong-key")
        with pytest.raises(SearchError) as refused:
            bridge.run(wrong.search("amber falcon"), timeout=10)
        assert "refused the key (HTTP 401)" in str(refused.value) and "BSA-wrong-key" not in str(refused.value)


def test_tavily_sends_its_key_as_a_bearer_token(bridge):
    with FakeTavily(default=HITS) as engine:
        tavily = WebSearch(bridge, engine="tavily", url=f"{engine.url}/search", api_key=FakeTavily.key, max_results=1)
        text = bridge.run(tavily.search("amber falcon"), timeout=10)
        assert "https://news.example.org/amber-falcon-2" in text and "changelog" not in text
        assert engine.queries[-1] == {"query": "amber falcon", "max_results": 1, "auth": f"Bearer {FakeTavily.key}"}


def test_an_unreachable_or_non_json_engine_is_a_clear_error(bridge, page_server):
    with pytest.raises(SearchError, match="unreachable"):
        bridge.run(WebSearch(bridge, url="http://127.0.0.1:9").search("x"), timeout=10)
    with pytest.raises(SearchError, match="HTTP 404"):
        bridge.run(WebSearch(bridge, url=page_server.url).search("x"), timeout=10)


def test_the_engine_settings_are_checked_and_the_key_is_a_secret(monkeypatch):
    from gateway.core.config import load_config

    monkeypatch.setenv("BRAVE_KEY", "BSA-secret-value")
    config = load_config(None, search={"engine": "brave", "api_key_env": "BRAVE_KEY"})
    assert config.search.configured() and "BSA-secret-value" in config.secret_values()
    with pytest.raises(ValueError, match="needs a key"):
        WebSearch(AsyncBridge(), engine="tavily")
    with pytest.raises(ValueError, match="SearXNG instance URL"):
        WebSearch(AsyncBridge())
    assert json.dumps(load_config(None).search.model_dump())  # unset: off, and serialisable


async def test_doctor_says_whether_the_engine_answers(tmp_path, fake_openai, searxng, capsys):
    from gateway.app.doctor import run_doctor

    await run_doctor(gateway_config(tmp_path, fake_openai, search={"url": searxng.url}))
    assert "[ok] web search: searxng answers (3 results)" in capsys.readouterr().out
    with FakeSearxng(default=HITS) as engine:
        engine.json_enabled = False
        await run_doctor(gateway_config(tmp_path, fake_openai, search={"url": engine.url}))
    assert "[FAIL] web search: searxng: SearXNG answered 403: enable the JSON format" in capsys.readouterr().out
