"""Slack files to the model, end to end through slack-bolt/slack-sdk and openai against the fakes:
``url_private_download`` is fetched with the bot token; without a token that can read files Slack
answers 200 with its HTML sign-in page, which is never passed on as an image."""

from __future__ import annotations

import io
import time

from PIL import Image

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until

DM = "D0ALICE001"


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 160, 60)).save(out, "PNG")
    return out.getvalue()


def file_share(text: str, ts: str, files: list[dict]) -> dict:
    return {"type": "message", "subtype": "file_share", "user": "U0ALICE001", "text": text, "ts": ts,
            "channel": DM, "channel_type": "im", "event_ts": ts, "team": "T0FAKE0001", "files": files}


def posts(fake, channel: str) -> list:
    return [c for c in fake.calls("chat.postMessage") if c.params["channel"] == channel]


async def test_several_files_in_one_message_are_one_turn_downloaded_with_the_token(tmp_path, fake_slack, fake_openai,
                                                                                   running):
    fake_openai.reset()
    fake_openai.script(oa.text("Two charts."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    before = len(posts(fake_slack, DM))
    files = [fake_slack.add_file("F0CHART001", png(800, 600), "image/png", "q1.png"),
             fake_slack.add_file("F0CHART002", png(640, 480), "image/png", "q2.png")]
    url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
    event = file_share("compare q1 and q2", f"{time.time():.6f}", files)
    assert (await fake_slack.post_event(url, event)).status == 200
    await wait_until(lambda: len(posts(fake_slack, DM)) == before + 1, what="one reply")

    sent = [r for r in fake_openai.requests if "compare q1 and q2" in str(r["json"])]
    assert len(sent) == 1 and len(oa.image_parts(sent[0])) == 2
    downloads = [r for r in fake_slack.file_requests if "F0CHART00" in r["path"]]
    assert len(downloads) == 2 and all(r["authorization"] == f"Bearer {fake_slack.bot_token}" for r in downloads)


async def test_a_download_without_file_access_is_never_treated_as_an_image(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("I only have your words."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    before = len(posts(fake_slack, DM))
    fake_slack.files_read_scope = False  # Slack then answers 200 text/html with its sign-in page
    try:
        files = [fake_slack.add_file("F0SECRET01", png(300, 200), "image/png", "secret.png")]
        url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
        event = file_share("what is this?", f"{time.time():.6f}", files)
        assert (await fake_slack.post_event(url, event)).status == 200
        await wait_until(lambda: len(posts(fake_slack, DM)) == before + 1, what="the reply")
    finally:
        fake_slack.files_read_scope = True

    reply = posts(fake_slack, DM)[-1].params["text"]
    assert "sign-in page" in reply and "files:read" in reply
    sent = [r for r in fake_openai.requests if "what is this?" in str(r["json"])]
    assert len(sent) == 1 and oa.image_parts(sent[0]) == []  # the HTML never went to the model as an image
    assert "could not be used: Slack sent its sign-in page" in sent[0]["json"]["messages"][-1]["content"]


async def test_a_file_url_off_slack_never_gets_the_token(tmp_path, fake_slack, fake_openai, page_server, running):
    fake_openai.reset()
    fake_openai.script(oa.text("Noted."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack), running)
    before = len(posts(fake_slack, DM))
    planted = {"id": "F0PLANTED1", "name": "x.png", "mimetype": "image/png", "size": 10,
               "url_private_download": f"{page_server.url}/page"}
    url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
    assert (await fake_slack.post_event(url, file_share("look", f"{time.time():.6f}", [planted]))).status == 200
    await wait_until(lambda: len(posts(fake_slack, DM)) == before + 1, what="the reply")
    assert "not on Slack" in posts(fake_slack, DM)[-1].params["text"]
