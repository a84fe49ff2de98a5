"""The web chat's attach button in a real browser (headless system Chromium via Playwright): a
picture chosen with the 📎 input is uploaded, sent with the text, reaches the model as an image
part, and shows inline in the user's message once its transcript row arrives. Skipped when
Chromium is missing, except in CI."""

from __future__ import annotations

import io
import os

import pytest
from PIL import Image

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.test_browser import CHROMIUM, _browser_available

_missing = _browser_available()
if _missing and not os.environ.get("CI"):
    pytest.skip(_missing, allow_module_level=True)


async def test_a_picture_attached_in_the_page_reaches_the_model_and_shows_inline(tmp_path, fake_openai, running):
    from playwright.async_api import async_playwright

    fake_openai.reset()
    fake_openai.script(oa.text("A green field."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    picture = io.BytesIO()
    Image.new("RGB", (640, 400), (20, 180, 40)).save(picture, "JPEG")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = await browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
            await page.goto(f"http://127.0.0.1:{gateway.http_port}/")
            await page.set_input_files("#files", files=[{"name": "field.jpg", "mimeType": "image/jpeg",
                                                          "buffer": picture.getvalue()}])
            await page.wait_for_selector("#pending >> text=field.jpg")
            await page.fill("#text", "what is this?")
            await page.press("#text", "Enter")

            await page.wait_for_selector(".msg.assistant[data-row] >> text=A green field.", timeout=20_000)
            image = await page.wait_for_selector(".msg.user .files img", timeout=10_000)
            await page.wait_for_function("img => img.complete && img.naturalWidth === 640", arg=image)
            assert await page.locator("#pending .file").count() == 0
            assert not errors, errors
        finally:
            await browser.close()
    sent = [r for r in fake_openai.requests if "what is this?" in str(r["json"])]
    assert len(sent) == 1 and len(oa.image_parts(sent[0])) == 1


async def test_the_page_sends_again_when_the_gateway_is_not_ready_yet(tmp_path, fake_openai, running):
    """A 503 (the gateway starting or stopping, nothing stored) is retried by the page with the same
    message id, after ``Retry-After``: the message is answered once, and the user sees no error."""
    from playwright.async_api import async_playwright

    fake_openai.reset()
    fake_openai.script(oa.text("Ready now."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    refused: list[str] = []

    async def not_ready_twice(route):
        if len(refused) < 2:
            refused.append(route.request.post_data or "")
            await route.fulfill(status=503, headers={"Retry-After": "1"}, content_type="application/json",
                                body='{"error": "the gateway is starting or stopping; retry later"}')
        else:
            await route.continue_()

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = await browser.new_page()
            await page.route("**/web/messages", not_ready_twice)
            await page.goto(f"http://127.0.0.1:{gateway.http_port}/")
            await page.fill("#text", "are you up?")
            await page.press("#text", "Enter")
            await page.wait_for_selector(".msg.assistant[data-row] >> text=Ready now.", timeout=20_000)
            assert await page.locator(".msg.failed").count() == 0
        finally:
            await browser.close()
    assert len(refused) == 2 and len({r for r in refused}) == 1  # the same body (same id) each time
    assert len([r for r in fake_openai.requests if "are you up?" in str(r["json"])]) == 1
