"""Browser tools on Playwright + the system Chromium, on the AsyncBridge loop.

A local site with a login form: turn 1 logs in, turn 2 (a later message) reads a page that needs
the login, through the whole gateway (Telegram fake, fake model). Skipped when Chromium is
missing, except in CI (``CI`` set), where ``.ci/run`` installs it and the test must run.
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
from agent.context import RunContext
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.fakes.server import ThreadedServer
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
