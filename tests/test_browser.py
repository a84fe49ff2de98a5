"""Browser tools on Playwright + the system Chromium, on the AsyncBridge loop.

A local site with a login form: turn 1 logs in, turn 2 (a later message) reads a page that needs
the login, through the whole gateway (Telegram fake, fake model). SSRF (issue 17): redirects,
subresources and host names that resolve to loopback are refused by the browser's proxy, and
what they would have returned never reaches the model. Skipped when Chromium is missing, except
in CI (``CI`` set), where ``.ci/run`` installs it and the test must run.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from typing import Any

import pytest
from aiohttp import web

from agent.bridge import AsyncBridge
from agent.browser import BrowserTools
from agent.budget import Limits
from agent.context import RunContext
from agent.loop import run_turn
from agent.model import OpenAIChatModel
from agent.netguard import NetGuard
from agent.tools import ToolRegistry
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.server import ThreadedServer
from tests.fakes.ssrf_sites import PUBLIC_NETWORK, SECRET, FakeResolver, InternalServer, PublicSite, redirect_chain
from tests.test_telegram_e2e import dm_update, sends_to

CHROMIUM = "/usr/bin/chromium"


def _browser_available() -> str | None:
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} not installed (apt-get install chromium)"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "playwright not installed"
    return None


_missing = _browser_available()
if _missing and not os.environ.get("CI"):
    pytest.skip(_missing, allow_module_level=True)


class LoginSite(ThreadedServer):
    """``/login`` (form), POST ``/login`` (sets a session cookie), ``/reports`` (needs it)."""

    SESSION = "tok-6f1c"

    def build_app(self) -> web.Application:
        async def login_form(_: web.Request) -> web.Response:
            return web.Response(content_type="text/html", text=(
                "<html><head><title>Sign in</title></head><body><h1>Sign in</h1>"
                "<form method='post' action='/login'><input id='user' name='user'>"
                "<input id='password' name='password' type='password'>"
                "<button type='submit'>Log in</button></form></body></html>"))

        async def login(request: web.Request) -> web.Response:
            form = await request.post()
            if form.get("user") == "alice" and form.get("password") == "s3cret":
                response = web.HTTPFound("/account")
                response.set_cookie("session", self.SESSION, httponly=True)
                raise response
            return web.Response(content_type="text/html", text="<p>Wrong password</p>", status=401)

        async def account(request: web.Request) -> web.Response:
            if request.cookies.get("session") != self.SESSION:
                raise web.HTTPFound("/login")
            return web.Response(content_type="text/html", text="<title>Account</title><p>Welcome, alice.</p>")

        async def reports(request: web.Request) -> web.Response:
            if request.cookies.get("session") != self.SESSION:
                return web.Response(content_type="text/html", text="<title>Reports</title><p>Please log in.</p>")
            return web.Response(content_type="text/html",
                                text="<title>Reports</title><p>Quarterly revenue: 4.2M (codename heron).</p>")

        app = web.Application()
        app.add_routes([web.get("/login", login_form), web.post("/login", login), web.get("/account", account),
                        web.get("/reports", reports)])
        return app


@pytest.fixture(scope="module")
def site():
    with LoginSite() as server:
        yield server


def answer_from_tool(request: dict[str, Any]) -> oa.Reply:
    last = request["messages"][-1]
    if last["role"] == "tool":
        content = last["content"]
        found = "heron" if "heron" in content else "logged in" if "Welcome, alice" in content else "no access"
        return oa.text(f"result: {found}")
    return oa.text("?")


async def test_login_in_turn_one_is_still_there_in_turn_two(tmp_path, site, fake_telegram, fake_openai, running):
    fake_openai.reset()
    config = gateway_config(tmp_path, fake_openai, fake_telegram, tools={"browser_allow_private": True})
    gateway = await start_gateway(config, running)
    assert "browser_open" in gateway.tools.tools
    chat, other = 5553001, 5553002

    # Turn 1: open the login page, fill the form (two parallel calls), submit.
    fake_openai.script(
        oa.tool_calls(oa.call("browser_open", {"url": f"{site.url}/login"})),
        oa.tool_calls(oa.call("browser_fill", {"selector": "#user", "text": "alice"}),
                      oa.call("browser_fill", {"selector": "#password", "text": "s3cret"})),
        oa.tool_calls(oa.call("browser_click", {"selector": "button[type=submit]"})),
    )
    fake_openai.responder = answer_from_tool
    fake_telegram.inject(dm_update("log in to the reports site", 9801, user_id=chat))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == chat, timeout=30)
    assert sends_to(fake_telegram, chat)[0].params["text"] == "result: logged in"

    # Turn 2, a later message: the page needs the login made in turn 1.
    fake_openai.script(oa.tool_calls(oa.call("browser_open", {"url": f"{site.url}/reports"})))
    fake_telegram.inject(dm_update("what was the revenue?", 9802, user_id=chat))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == chat
                                      and c.params["text"] != "result: logged in", timeout=30)
    assert sends_to(fake_telegram, chat)[-1].params["text"] == "result: heron"
    tool_result = fake_openai.requests[-1]["json"]["messages"][-1]
    assert "Quarterly revenue: 4.2M" in tool_result["content"] and 'trust="untrusted"' in tool_result["content"]

    # Another conversation has its own browser context: no login there.
    fake_openai.script(oa.tool_calls(oa.call("browser_open", {"url": f"{site.url}/reports"})))
    fake_telegram.inject(dm_update("revenue?", 9803, user_id=other))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == other, timeout=30)
    assert sends_to(fake_telegram, other)[0].params["text"] == "result: no access"


def test_idle_contexts_are_closed_and_shutdown_is_clean(site, caplog):
    bridge = AsyncBridge()
    bridge.start()
    # Idle long enough that a loaded machine does not reap the context between two calls.
    browser = BrowserTools(bridge, executable_path=CHROMIUM, idle_s=3.0, allow_private=True, timeout_s=10)
    ctx = RunContext(session_id="s1")
    try:
        bridge.run(browser.open(ctx, f"{site.url}/login"), 30)
        bridge.run(browser.fill(ctx, "#user", "alice"), 10)
        bridge.run(browser.fill(ctx, "#password", "s3cret"), 10)
        assert "Welcome, alice" in bridge.run(browser.click(ctx, "button[type=submit]"), 10)
        assert "heron" in bridge.run(browser.open(ctx, f"{site.url}/reports"), 10)
        assert browser.open_sessions == 1
        deadline = time.monotonic() + 15
        while browser.open_sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert browser.open_sessions == 0  # the reaper closed the idle context, cookies with it
        assert "Please log in" in bridge.run(browser.open(ctx, f"{site.url}/reports"), 10)
        assert browser.launches == 1
    finally:
        bridge.stop()
    assert "Event loop is closed" not in caplog.text


def test_private_hosts_are_blocked_unless_allowed(site):
    bridge = AsyncBridge()
    bridge.start()
    browser = BrowserTools(bridge, executable_path=CHROMIUM, allow_private=False, timeout_s=5)
    try:
        with pytest.raises(PermissionError):
            bridge.run(browser.open(RunContext(session_id="s"), f"{site.url}/login"), 10)
        assert "only absolute http" in bridge.run(browser.open(RunContext(), "file:///etc/passwd"), 10)
    finally:
        bridge.stop()


def test_chromium_is_the_system_package():
    assert shutil.which("chromium") == CHROMIUM or os.path.exists(CHROMIUM)
    assert asyncio.iscoroutinefunction(BrowserTools.open)


@pytest.fixture(scope="module")
def internal():
    with InternalServer() as server:
        yield server


@pytest.fixture(scope="module")
def internal6():
    with InternalServer("::1") as server:
        yield server


@pytest.fixture(scope="module")
def public():
    with PublicSite() as server:
        yield server


@pytest.fixture(scope="module")
def guarded_browser():
    """Chromium behind a guard that treats the test's public site as public (names from FakeResolver)."""
    bridge = AsyncBridge()
    bridge.start()
    guard = NetGuard(allow=[PUBLIC_NETWORK], resolver=FakeResolver())
    yield bridge, BrowserTools(bridge, executable_path=CHROMIUM, guard=guard, timeout_s=10)
    bridge.stop()


def open_in_a_turn(fake_openai, bridge: AsyncBridge, browser: BrowserTools, url: str, session: str) -> str:
    """One agent turn in which the model calls ``browser_open(url)``; the tool result it was sent next."""
    fake_openai.reset()
    fake_openai.script(oa.tool_calls(oa.call("browser_open", {"url": url})), oa.text("done"))
    tools = ToolRegistry()
    for tool in browser.tools():
        tools.add(tool)
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)
    outcome = run_turn(system_prompt="s", history=[{"role": "user", "content": f"open {url}"}], model=model,
                       tools=tools, bridge=bridge, limits=Limits(), record=lambda *a: None,
                       context=RunContext(session_id=session))
    assert outcome.reply == "done"
    message = fake_openai.requests[-1]["json"]["messages"][-1]
    assert message["role"] == "tool"
    return message["content"]


@pytest.mark.parametrize(("target", "hops", "reason"), [
    pytest.param("{i}/secret", 1, "refused 127.0.0.1: a loopback address", id="one-hop-loopback"),
    pytest.param("{i6}/secret", 2, "refused ::1: a loopback address", id="two-hops-ipv6-loopback"),
    pytest.param("http://internal.test:{port}/secret", 0, "refused internal.test (127.0.0.1)",
                 id="name-resolves-private"),
    pytest.param("http://[::ffff:127.0.0.1]:{port}/secret", 1, "IPv4 127.0.0.1 inside", id="redirect-ipv4-mapped"),
    pytest.param("http://2130706433:{port}/secret", 1, "refused 127.0.0.1: a loopback", id="redirect-decimal"),
    pytest.param("http://0177.0.0.1:{port}/secret", 2, "refused 127.0.0.1: a loopback", id="redirect-octal"),
    pytest.param("https://internal.test:{port}/secret", 0, "refused internal.test (127.0.0.1)", id="https-tunnel"),
])
def test_browser_refuses_private_targets_on_every_hop(target, hops, reason, fake_openai, guarded_browser, internal,
                                                       internal6, public):
    bridge, browser = guarded_browser
    target = target.format(i=internal.url, i6=internal6.url, port=internal.port)
    url = redirect_chain(f"http://public.test:{public.port}", target, hops)
    before = len(internal.hits) + len(internal6.hits)
    result = open_in_a_turn(fake_openai, bridge, browser, url, session=f"ssrf-{hops}")
    assert reason in result, result
    assert SECRET not in result
    assert len(internal.hits) + len(internal6.hits) == before  # the browser never reached it


def test_browser_refuses_private_subresources_and_says_so(fake_openai, guarded_browser, internal, public):
    bridge, browser = guarded_browser
    before = len(internal.hits)
    result = open_in_a_turn(fake_openai, bridge, browser,
                            f"http://public.test:{public.port}/embeds?port={internal.port}", session="embeds")
    assert "A public page with embeds." in result  # the public page itself loads
    assert "request(s) of this page were refused" in result and "a loopback address" in result
    assert SECRET not in result
    assert internal.hits[before:] == []


def test_browser_reaches_public_pages_through_redirects(fake_openai, guarded_browser, public):
    bridge, browser = guarded_browser
    result = open_in_a_turn(fake_openai, bridge, browser, f"http://public.test:{public.port}/loop?n=3", session="ok")
    assert "A public page." in result and f"URL: http://public.test:{public.port}/page" in result
    assert "refused" not in result


def test_allow_private_still_reaches_loopback_names_through_the_proxy(fake_openai, internal, public):
    """``tools.browser_allow_private``: private targets are allowed, and still reached through the
    proxy (Chromium cannot resolve ``internal.test`` itself; the guard's resolver does)."""
    bridge = AsyncBridge()
    bridge.start()
    guard = NetGuard(allow_private=True, resolver=FakeResolver())
    browser = BrowserTools(bridge, executable_path=CHROMIUM, guard=guard, timeout_s=10)
    try:
        target = f"http://internal.test:{internal.port}/secret"
        result = open_in_a_turn(fake_openai, bridge, browser, redirect_chain(f"http://public.test:{public.port}",
                                                                            target, 2), session="private-ok")
        assert SECRET in result and f"URL: {target}" in result
    finally:
        bridge.stop()
