"""The web chat in a real browser: headless system Chromium (Debian package) driven by Playwright
opens ``/``, sends a message, and sees the fake model's reply stream in and settle; HTML from the
model and an HTML user name show as text. A screenshot is saved in the test's tmp_path. Skipped
when Chromium is missing, except in CI, where ``.ci/run`` installs it and the test must run."""

from __future__ import annotations

import os

import pytest

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_browser import CHROMIUM, _browser_available

_missing = _browser_available()
if _missing and not os.environ.get("CI"):
    pytest.skip(_missing, allow_module_level=True)

STREAM_FAST = {"stream_first_after_s": 0.2, "stream_edit_interval_s": {"web": 0.2}}
REPLY = ("Hello! Here is **the plan**: " + " ".join(f"step {i} is ready." for i in range(24))
         + " <script>window.pwned = 1</script> <img src=x onerror=\"window.pwned = 1\">")
NAME = "<b onmouseover=alert(1)>Ann</b>"


async def test_a_browser_sends_a_message_and_sees_the_reply_stream_in(tmp_path, fake_openai, running):
    from playwright.async_api import async_playwright

    fake_openai.reset()
    fake_openai.script(oa.text(REPLY, pieces=12, piece_delay_s=0.2))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, agent=STREAM_FAST), running)
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = await browser.new_context(viewport={"width": 390, "height": 780})  # a phone's screen
            page = await context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
            await page.goto(f"http://127.0.0.1:{gateway.http_port}/")
            await page.fill("#name", NAME)
            await page.fill("#text", "hi, what is the plan?")
            await page.press("#text", "Enter")

            # The message shows at once; typing, then the preview growing, then the final answer.
            await page.wait_for_selector(".msg.user >> text=hi, what is the plan?")
            await page.wait_for_selector("#typing:not([hidden])", timeout=10_000)
            preview = await page.wait_for_selector(".msg.assistant.live", timeout=15_000)
            first_preview = await preview.inner_text()
            assert "step" in first_preview or "Hello" in first_preview
            final = await page.wait_for_selector(".msg.assistant[data-row]", timeout=20_000)
            await page.wait_for_selector(".msg.assistant.live", state="detached", timeout=5_000)
            await page.screenshot(path=str(tmp_path / "web-chat.png"), full_page=True)

            text = await final.inner_text()
            assert "the plan" in text and "step 23 is ready." in text and len(text) > len(first_preview)
            assert await final.eval_on_selector("strong", "e => e.textContent") == "the plan"  # markdown rendered
            assert "<script>window.pwned = 1</script>" in text  # shown as text, never run
            assert await page.evaluate("window.pwned") is None
            assert await page.locator(".msg.assistant").count() == 1  # one answer, not preview + final
            assert await page.locator(".msg.user .meta").inner_text() == NAME
            assert await page.locator(".msg.user b").count() == 0
            assert await page.locator("#typing").is_hidden()
            assert not errors, errors
            assert (tmp_path / "web-chat.png").stat().st_size > 0
        finally:
            await browser.close()


async def test_arriving_from_another_site_keeps_the_identity_and_the_conversation(tmp_path, fake_openai, running):
    """A link on another site (here a page Playwright serves as ``http://other.test``) opens the
    chat with a top-level navigation: the identity cookie goes along, so the page shows the same
    conversation and sets no new identity."""
    from playwright.async_api import async_playwright

    fake_openai.reset()
    fake_openai.script(oa.text("remembered answer"))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    chat = f"http://127.0.0.1:{gateway.http_port}/"
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            context = await browser.new_context()
            page = await context.new_page()
            await page.goto(chat)
            await page.fill("#text", "remember this")
            await page.press("#text", "Enter")
            await page.wait_for_selector(".msg.assistant[data-row] >> text=remembered answer", timeout=15_000)
            before = [c["value"] for c in await context.cookies(chat) if c["name"] == "gw_web"]

            await context.route("http://other.test/**", lambda route: route.fulfill(
                status=200, content_type="text/html", body=f'<a id="go" href="{chat}">open the chat</a>'))
            await page.goto("http://other.test/")
            await page.click("#go")
            await page.wait_for_url(chat)
            await page.wait_for_selector(".msg.assistant[data-row] >> text=remembered answer", timeout=10_000)
            assert await page.locator(".msg.user >> text=remember this").count() == 1
            after = [c["value"] for c in await context.cookies(chat) if c["name"] == "gw_web"]
            assert before and after == before
        finally:
            await browser.close()
