"""SSRF through ``web_fetch`` (issue 17, item 3): every redirect hop and the address actually
connected are checked, and the content of a refused hop never reaches the model.

Layout on loopback: an *internal* server on 127.0.0.1 and on ::1 serves a secret (it stands for
an admin panel or the cloud metadata service) and counts requests; a *public* site bound on
127.10.0.1 (which the guard under test is told to treat as public, ``allow=...``) redirects
wherever its query says. Host names come from an injected resolver: ``public.test`` is the
public site, ``internal.test`` resolves to 127.0.0.1, ``rebind.test`` answers the public site on
its first lookup and the internal server afterwards. The agent loop runs with the real openai
client against the fake model; what the model is sent next is asserted.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest

from agent.bridge import AsyncBridge
from agent.budget import Limits
from agent.context import RunContext
from agent.loop import run_turn
from agent.model import OpenAIChatModel
from agent.netguard import NetGuard, address_problem, legacy_ipv4, open_url
from agent.tools import ToolRegistry
from agent.web import WebFetcher
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.ssrf_sites import PUBLIC_NETWORK, SECRET, FakeResolver, InternalServer, PublicSite, redirect_chain
from tests.test_telegram_e2e import dm_update


@pytest.fixture(scope="module")
def internal() -> Iterator[InternalServer]:
    with InternalServer() as server:
        yield server


@pytest.fixture(scope="module")
def internal6() -> Iterator[InternalServer]:
    with InternalServer("::1") as server:
        yield server


@pytest.fixture(scope="module")
def public() -> Iterator[PublicSite]:
    with PublicSite() as server:
        yield server


@pytest.fixture(scope="module")
def bridge() -> Iterator[AsyncBridge]:
    bridge = AsyncBridge()
    bridge.start()
    yield bridge
    bridge.stop()


def fetch_in_a_turn(fake_openai, bridge: AsyncBridge, fetcher: WebFetcher, url: str) -> str:
    """Runs one agent turn in which the model calls ``web_fetch(url)``; returns the tool result
    the model was sent in its next request."""
    fake_openai.reset()
    fake_openai.script(oa.tool_calls(oa.call("web_fetch", {"url": url})), oa.text("done"))
    tools = ToolRegistry()
    tools.add(fetcher.tool())
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)
    outcome = run_turn(system_prompt="s", history=[{"role": "user", "content": f"read {url}"}], model=model,
                       tools=tools, bridge=bridge, limits=Limits(), record=lambda *a: None,
                       context=RunContext(session_id="ssrf"))
    assert outcome.reply == "done"
    tool_message = fake_openai.requests[-1]["json"]["messages"][-1]
    assert tool_message["role"] == "tool"
    return tool_message["content"]


def guarded(bridge: AsyncBridge, resolver: FakeResolver | None = None, **kwargs: Any) -> WebFetcher:
    guard = NetGuard(allow=[PUBLIC_NETWORK], resolver=resolver or FakeResolver(), **kwargs)
    return WebFetcher(bridge, guard=guard, timeout_s=10)


REFUSED = [  # (target, redirect hops before it, what the refusal says)
    pytest.param("{i}/secret", 1, "127.0.0.1: a loopback", id="one-hop-loopback"),
    pytest.param("{i}/secret", 2, "127.0.0.1: a loopback", id="two-hops-loopback"),
    pytest.param("http://internal.test:{port}/secret", 0, "internal.test (127.0.0.1)", id="name-resolves-private"),
    pytest.param("http://internal.test:{port}/secret", 1, "internal.test (127.0.0.1)", id="redirect-to-such-a-name"),
    pytest.param("{i6}/secret", 0, "::1: a loopback", id="ipv6-loopback"),
    pytest.param("{i6}/secret", 1, "::1: a loopback", id="redirect-ipv6-loopback"),
    pytest.param("http://[::ffff:127.0.0.1]:{port}/secret", 0, "IPv4 127.0.0.1 inside an IPv6", id="ipv4-mapped"),
    pytest.param("http://[::ffff:127.0.0.1]:{port}/secret", 1, "IPv4 127.0.0.1 inside", id="redirect-ipv4-mapped"),
    pytest.param("http://2130706433:{port}/secret", 0, "non-canonical IPv4 form of a loopback", id="decimal"),
    pytest.param("http://2130706433:{port}/secret", 1, "non-canonical IPv4 form of a loopback", id="redirect-decimal"),
    pytest.param("http://0177.0.0.1:{port}/secret", 0, "non-canonical IPv4 form of a loopback", id="octal"),
    pytest.param("http://0177.0.0.1:{port}/secret", 1, "non-canonical IPv4 form of a loopback", id="redirect-octal"),
    pytest.param("http://169.254.169.254/latest/meta-data/", 1, "169.254.169.254: a link-local", id="metadata"),
    pytest.param("file:///etc/passwd", 1, "not an absolute http", id="redirect-to-file"),
]


@pytest.mark.parametrize(("target", "hops", "reason"), REFUSED)
def test_refused_hops_never_reach_the_model(target, hops, reason, fake_openai, bridge, internal, internal6, public):
    target = target.format(i=internal.url, i6=internal6.url, port=internal.port)
    url = redirect_chain(f"http://public.test:{public.port}", target, hops)
    before = len(internal.hits) + len(internal6.hits)
    result = fetch_in_a_turn(fake_openai, bridge, guarded(bridge), url)
    assert result.startswith("Error: web_fetch failed: BlockedAddress: refused") and reason in result, result
    if hops:
        assert f"reached by a redirect from http://public.test:{public.port}/" in result
    assert SECRET not in result
    assert len(internal.hits) + len(internal6.hits) == before  # nothing was even requested there


def test_a_name_rebound_to_loopback_after_a_check_is_refused_at_connect(fake_openai, bridge, internal, public):
    resolver = FakeResolver()
    fetcher = guarded(bridge, resolver)
    port = internal.port
    # The first lookup of rebind.test answers the public site, later ones 127.0.0.1. The old check
    # (resolve, then let aiohttp resolve again) let the second answer through; the guard filters
    # the answer the connector itself uses, every time.
    first = fetch_in_a_turn(fake_openai, bridge, fetcher, f"http://rebind.test:{public.port}/page")
    assert "A public page." in first
    before = len(internal.hits)
    fresh = guarded(bridge, resolver)  # a new connector: no DNS cache, the next lookup is internal
    second = fetch_in_a_turn(fake_openai, bridge, fresh, f"http://rebind.test:{port}/secret")
    assert "refused rebind.test (127.0.0.1): a loopback address" in second and SECRET not in second
    assert len(internal.hits) == before and resolver.lookups.count("rebind.test") == 2


def test_public_redirects_are_followed_and_the_hop_limit_holds(fake_openai, bridge, public):
    fetcher = guarded(bridge)
    ok = fetch_in_a_turn(fake_openai, bridge, fetcher, f"http://public.test:{public.port}/loop?n=4")
    assert "A public page." in ok and f"Redirected to: http://public.test:{public.port}/page" in ok
    too_many = fetch_in_a_turn(fake_openai, bridge, fetcher, f"http://public.test:{public.port}/loop?n=5")
    assert "TooManyRedirects" in too_many and "more than 5 redirects" in too_many


def test_a_cookie_set_for_one_fetch_never_goes_out_with_the_next(fake_openai, bridge, public):
    """One ``WebFetcher`` serves every user and turn: a cookie a site set while one user's turn
    fetched it must not be sent when another turn fetches the same site."""
    fetcher = guarded(bridge)
    fetch_in_a_turn(fake_openai, bridge, fetcher, f"http://public.test:{public.port}/setcookie")
    echoed = fetch_in_a_turn(fake_openai, bridge, fetcher, f"http://public.test:{public.port}/headers")
    assert '"Cookie": null' in echoed and "user-one-session-cookie" not in echoed


def test_a_page_sent_in_many_chunks_is_read_whole(fake_openai, bridge, public):
    """``StreamReader.read(n)`` returns what is buffered: the model was given the first line of a
    page streamed in 20, with no truncation marker (found by a review)."""
    result = fetch_in_a_turn(fake_openai, bridge, guarded(bridge), f"http://public.test:{public.port}/streamed")
    assert all(f"line {n:02d} " in result for n in range(1, 21)), result[:400]
    capped = WebFetcher(bridge, guard=NetGuard(allow=[PUBLIC_NETWORK], resolver=FakeResolver()), timeout_s=10,
                        max_bytes=1000)
    result = fetch_in_a_turn(fake_openai, bridge, capped, f"http://public.test:{public.port}/streamed")
    assert "line 04 " in result and "line 05 " not in result, result[:400]


def test_allow_private_still_reaches_loopback_through_redirects(fake_openai, bridge, internal, public):
    fetcher = WebFetcher(bridge, guard=NetGuard(allow_private=True, resolver=FakeResolver()), timeout_s=10)
    result = fetch_in_a_turn(fake_openai, bridge, fetcher,
                             f"http://public.test:{public.port}/hop2?u={quote(internal.url + '/secret')}")
    assert SECRET in result and f"Redirected to: {internal.url}/secret" in result


async def test_the_gateway_refuses_loopback_by_default(tmp_path, fake_telegram, fake_openai, internal, running):
    """The real wiring (``tools.web_fetch_allow_private`` off): the model's fetch of a loopback URL
    is refused and the model is told why, without the page."""
    fake_openai.reset()
    url = f"{internal.url}/secret"
    fake_openai.script(oa.tool_calls(oa.call("web_fetch", {"url": url})))
    fake_openai.responder = lambda req: oa.text("could not read it")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, tools={"web_fetch_allow_private": False})
    await start_gateway(config, running)
    before = len(internal.hits)
    fake_telegram.inject(dm_update(f"read {url}", 9951, user_id=5559501))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5559501, timeout=15)
    tool_message = fake_openai.requests[-1]["json"]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert "refused 127.0.0.1: a loopback address" in tool_message["content"]
    assert SECRET not in tool_message["content"] and len(internal.hits) == before


async def test_credentials_are_dropped_when_a_redirect_leaves_the_origin(public):
    """For the gateway's downloads with a platform token: a redirect to another host never
    carries the token along."""
    guard = NetGuard(allow=[PUBLIC_NETWORK], resolver=FakeResolver())
    creds = {"Authorization": "Bearer xoxb-not-for-others", "Cookie": "s=1"}
    base = f"http://public.test:{public.port}"
    async with guard.session() as session:
        async with open_url(session, f"{base}/to?u={quote(base + '/headers')}", guard, headers=creds) as same:
            assert (await same.json())["Authorization"] == "Bearer xoxb-not-for-others"
        other = f"http://other.test:{public.port}/headers"
        async with open_url(session, f"{base}/to?u={quote(other)}", guard, headers=creds) as response:
            seen = await response.json()
    assert seen == {"Authorization": None, "Cookie": None, "Host": f"other.test:{public.port}"}


@pytest.mark.parametrize(("address", "problem"), [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("::127.0.0.1", "loopback"),
    ("10.1.2.3", "private"), ("192.168.0.1", "private"), ("172.16.5.4", "private"), ("fd00::1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1%eth0", "link-local"), ("::ffff:169.254.169.254", "link-local"),
    ("0.0.0.0", "unspecified"), ("::", "unspecified"), ("224.0.0.251", "multicast"), ("ff02::1", "multicast"),
    ("100.64.1.1", "not globally routable"), ("240.0.0.1", "private"), ("fec0::1", "site-local"),
    ("2002:7f00:1::", "loopback"), ("64:ff9b::a00:1", "private"),
    ("93.184.215.14", None), ("2606:4700::6810:85e5", None), ("::ffff:93.184.215.14", None),
])
def test_address_rule(address, problem):
    import ipaddress

    assert address_problem(ipaddress.ip_address(address)) == problem


@pytest.mark.parametrize(("host", "means"), [("2130706433", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"),
                                             ("0x7f.1", "127.0.0.1"), ("127.1", "127.0.0.1"),
                                             ("127.0.0.1", None), ("example.org", None), ("1.2.3.256", None)])
def test_legacy_numeric_hosts(host, means):
    assert (str(legacy_ipv4(host)) if legacy_ipv4(host) else None) == means
