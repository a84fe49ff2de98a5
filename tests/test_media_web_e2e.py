"""Files from the web chat: the attach button and drag-and-drop upload through ``POST /web/files``
(size-limited, stored in the blob store), then the message goes through the same inbox; the image
reaches the model as a content part and the page shows it inline, to its own browser only."""

from __future__ import annotations

import asyncio
import io
import os
import re
import time

from PIL import Image

from gateway.media.store import digest
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.web_client import WebClient


def base_of(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGBA", (width, height), (0, 90, 200, 128)).save(out, "PNG")
    return out.getvalue()


async def test_an_uploaded_image_reaches_the_model_and_the_page_shows_it(tmp_path, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("A translucent blue square."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    page, stranger = WebClient(base_of(gateway)), WebClient(base_of(gateway))
    try:
        await page.open()
        await stranger.open()
        page.listen()
        status, answer = await page.upload(png(500, 500), "image/png", "diagram%20v2.png")
        assert status == 200 and answer["ok"] and answer["file"]["name"] == "diagram v2.png"
        response = await page.say("what is this?", files=[answer["file"]])
        assert response.status == 200
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), timeout=20, what="the answer")

        sent = [r for r in fake_openai.requests if "what is this?" in str(r["json"])]
        assert len(sent) == 1
        images = oa.image_parts(sent[0])
        assert len(images) == 1 and images[0][0] == "image/png"  # transparency kept as PNG
        assert '[image "diagram v2.png" (image/png' in sent[0]["json"]["messages"][-1]["content"][0]["text"]

        row = page.of("row", lambda e: e["role"] == "user")[0]
        shown = row["attachments"][0]
        assert shown["name"] == "diagram v2.png" and shown["url"].startswith("/web/files/")
        async with page.http.get(base_of(gateway) + shown["url"]) as response:
            assert response.status == 200 and response.content_type == "image/png"
            assert await response.read() == images[0][1]  # the rendition the model saw
        async with stranger.http.get(base_of(gateway) + shown["url"]) as response:
            assert response.status == 404  # another browser's ticket does not match
        refused = await stranger.say("mine now", files=[answer["file"]])
        assert refused.status == 400  # nobody attaches another browser's upload
    finally:
        await page.close()
        await stranger.close()


async def test_an_upload_over_the_limit_is_refused_naming_it(tmp_path, fake_openai, running):
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai,
                                                 media={"directory": str(tmp_path / "m"), "upload_max_mb": 0.5}),
                                  running)
    page = WebClient(base_of(gateway))
    try:
        await page.open()
        status, answer = await page.upload(b"x" * 600_000, "application/zip", "big.zip")
        assert status == 413 and "up to 0.5 MB" in answer["error"]
        assert fake_openai.requests == []
    finally:
        await page.close()


async def test_an_upload_over_its_kinds_limit_is_refused_whatever_size_the_message_claims(tmp_path, fake_openai,
                                                                                         running):
    """A message names its uploads with the size the browser says; the per-kind limit
    (``media.max_mb``) was checked against that claim only, so a page saying "size": 1 had a
    picture over the image limit decoded and shown to the model (found by a review)."""
    fake_openai.reset()
    fake_openai.script(oa.text("Seen."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, media={
        "directory": str(tmp_path / "m"), "max_mb": {"image": 0.1, "document": 50.0}}), running)
    page = WebClient(base_of(gateway))
    try:
        await page.open()
        page.listen()
        noise = Image.frombytes("RGB", (300, 300), os.urandom(300 * 300 * 3))
        out = io.BytesIO()
        noise.save(out, "PNG")
        big = out.getvalue()
        assert len(big) > 200_000
        status, answer = await page.upload(big, "image/png", "noise.png")
        assert status == 200
        response = await page.say("what is it?", files=[{**answer["file"], "size": 1}])
        assert response.status == 200
        await wait_until(lambda: page.of("reply"), timeout=20, what="the answer")
        assert page.of("reply")[0]["text"].startswith('⚠️ I could not use "noise.png": too big (0.3 MB); this '
                                                      "gateway can take image files up to 0.1 MB.")
        sent = [r for r in fake_openai.requests if "what is it?" in str(r["json"])]
        assert all(oa.image_parts(r) == [] for r in sent)
    finally:
        await page.close()


async def test_the_admin_transcript_shows_thumbnails_and_file_names(tmp_path, fake_openai, running):
    from tests.test_web_admin import ADMIN, Operator

    fake_openai.reset()
    fake_openai.script(oa.text("Got it."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web=ADMIN), running)
    page, operator = WebClient(base_of(gateway)), Operator(base_of(gateway))
    try:
        await page.open()
        page.listen()
        _, answer = await page.upload(png(1200, 900), "image/png", "<img src=x>plan.png")
        await page.say("see attached", files=[answer["file"]])
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), timeout=20, what="the answer")

        status, _, _ = await operator.get(f"/admin/files/{answer['file']['sha256']}")
        assert status == 403  # not logged in
        await operator.login()
        _, listing, _ = await operator.get("/admin/sessions")
        link = re.search(r'href="/admin/sessions/([0-9a-f]+)"', listing)
        assert link, listing[:500]
        status, html, _ = await operator.get(f"/admin/sessions/{link.group(1)}")
        assert status == 200
        assert "&#34;&lt;img src=x&gt;plan.png&#34;" in html and "<img src=x>" not in html  # quoted, escaped
        thumb = re.search(r'<img src="(/admin/files/[0-9a-f]{64})"', html)
        assert thumb
        async with operator.http.get(base_of(gateway) + thumb.group(1)) as response:
            assert response.status == 200 and response.content_type == "image/png"
            assert max(Image.open(io.BytesIO(await response.read())).size) == 256
    finally:
        await page.close()
        await operator.http.close()


async def test_a_browser_past_its_hourly_upload_quota_gets_429_and_others_go_on(tmp_path, fake_openai, running):
    """Anyone who can open the page gets an identity; one browser may upload ``web.uploads_per_hour``
    files and ``web.upload_mb_per_hour`` MB an hour, then 429 with ``Retry-After`` and nothing
    stored; another browser is not held back."""
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, web={"uploads_per_hour": 2,
                                                                             "upload_mb_per_hour": 1.0}), running)
    page, other = WebClient(base_of(gateway)), WebClient(base_of(gateway))
    try:
        await page.open()
        await other.open()
        for n in range(2):
            status, _answer = await page.upload(b"note %d" % n, "text/plain", f"n{n}.txt")
            assert status == 200
        headers = {"X-Requested-With": "gateway-web", "Content-Type": "text/plain"}
        async with page.http.post(f"{page.base}/web/files", data=b"one too many", headers=headers) as response:
            assert response.status == 429 and int(response.headers["Retry-After"]) > 3000
            assert "too many uploads" in (await response.json())["error"]
        stored = set(gateway.media.blobs.stored_before(time.time() + 1))
        assert digest(b"one too many") not in stored
        status, _answer = await other.upload(b"x" * 600_000, "application/zip", "a.zip")
        assert status == 200
        status, answer = await other.upload(b"y" * 600_000, "application/zip", "b.zip")  # past 1 MB this hour
        assert status == 429 and "too many uploads" in answer["error"]
    finally:
        await page.close()
        await other.close()


async def test_an_upload_never_sent_is_deleted_after_unreferenced_hours_and_a_sent_one_is_kept(
        tmp_path, fake_openai, running):
    """An upload no message uses is deleted once it was last stored ``media.unreferenced_hours``
    ago (the hourly sweep, ``MediaIndex.collect_unreferenced``); the same bytes uploaded again
    meanwhile count from then, and a file sent with a message stays while its conversation
    keeps it."""
    fake_openai.reset()
    fake_openai.script(oa.text("Noted."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai), running)
    page = WebClient(base_of(gateway))
    blobs = gateway.media.blobs
    day_ago = time.time() - 86400 - 60

    def age(sha: str) -> None:  # as if stored a day ago
        path = blobs.path(sha)
        assert path is not None
        os.utime(path, (day_ago, day_ago))

    try:
        await page.open()
        page.listen()
        _, sent = await page.upload(b"the minutes of monday", "text/plain", "minutes.txt")
        _, unsent = await page.upload(b"a draft never sent", "text/plain", "draft.txt")
        _, again = await page.upload(b"uploaded twice", "text/plain", "twice.txt")
        assert (await page.say("file this", files=[sent["file"]])).status == 200
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), timeout=20, what="the answer")
        for file in (sent, unsent, again):
            age(file["file"]["sha256"])
        status, _ = await page.upload(b"uploaded twice", "text/plain", "twice.txt")  # stored again just now
        assert status == 200

        removed = await asyncio.to_thread(gateway.media.index.collect_unreferenced, 24 * 3600)
        assert removed == 1
        assert blobs.path(unsent["file"]["sha256"]) is None
        assert blobs.path(sent["file"]["sha256"]) is not None and blobs.path(again["file"]["sha256"]) is not None
        async with page.http.get(f"{page.base}/web/files/{unsent['file']['sha256']}",
                                 params={"t": unsent["file"]["ticket"]}) as response:
            assert response.status == 404
    finally:
        await page.close()
