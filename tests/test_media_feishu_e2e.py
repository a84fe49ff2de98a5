"""Feishu images to the model, end to end through lark-oapi and openai against the fakes: a user's
image comes from ``GET /open-apis/im/v1/messages/{message_id}/resources/{key}?type=image`` with the
tenant token (the image API serves only the bot's own uploads)."""

from __future__ import annotations

import io

from PIL import Image

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until

P2P = "oc_fakep2p000000000000000000000001"


def jpeg(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (240, 200, 10)).save(out, "JPEG")
    return out.getvalue()


async def test_an_image_message_puts_the_image_in_the_request(tmp_path, fake_feishu, fake_openai, running):
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.script(oa.text("A yellow rectangle."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu), running)
    before = len(fake_feishu.sent(P2P))
    event = fake_feishu.text_event("", message_type="image", content={"image_key": "img_v3_fake_yellow"})
    message_id = event["event"]["message"]["message_id"]
    fake_feishu.add_resource(message_id, "img_v3_fake_yellow", jpeg(1024, 512), "image")

    status, _ = await fake_feishu.post_event(f"http://127.0.0.1:{gateway.http_port}/feishu/events", event)
    assert status == 200
    await wait_until(lambda: len(fake_feishu.sent(P2P)) == before + 1, what="the reply")

    assert len(fake_openai.requests) == 1
    images = oa.image_parts(fake_openai.requests[0])
    assert len(images) == 1 and Image.open(io.BytesIO(images[0][1])).size == (1024, 512)
    fetched = [c for c in fake_feishu.calls("resource")]
    assert len(fetched) == 1 and fetched[0].query == {"type": "image"} and fetched[0].token.startswith("t-")
    assert fetched[0].path == f"/open-apis/im/v1/messages/{message_id}/resources/img_v3_fake_yellow"


async def test_a_post_with_text_and_an_embedded_image_is_one_user_message(tmp_path, fake_feishu, fake_openai, running):
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.script(oa.text("Looks fine."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu), running)
    before = len(fake_feishu.sent(P2P))
    post = {"title": "", "content": [[{"tag": "text", "text": "is this chart right?"}],
                                     [{"tag": "img", "image_key": "img_v3_fake_chart"}]]}
    event = fake_feishu.text_event("", message_type="post", content=post)
    fake_feishu.add_resource(event["event"]["message"]["message_id"], "img_v3_fake_chart", jpeg(300, 200), "image")

    status, _ = await fake_feishu.post_event(f"http://127.0.0.1:{gateway.http_port}/feishu/events", event)
    assert status == 200
    await wait_until(lambda: len(fake_feishu.sent(P2P)) == before + 1, what="the reply")

    user = fake_openai.requests[0]["json"]["messages"][-1]
    assert "is this chart right?" in user["content"][0]["text"]
    assert len(oa.image_parts(fake_openai.requests[0])) == 1


async def test_a_post_with_more_images_than_a_message_may_carry_reads_the_first_ten(tmp_path, fake_feishu,
                                                                                    fake_openai, running):
    """A rich-text post may embed any number of images: each was downloaded, converted and sent in
    one model request (a provider's request limit, and the tokens, grew with them; found by a
    review). The first ten are read; the user is told the rest were not."""
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.script(oa.text("Ten charts."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu), running)
    before = len(fake_feishu.sent(P2P))
    keys = [f"img_v3_fake_many_{i:02d}" for i in range(13)]
    post = {"title": "", "content": [[{"tag": "text", "text": "check these"}],
                                     *[[{"tag": "img", "image_key": key}] for key in keys]]}
    event = fake_feishu.text_event("", message_type="post", content=post)
    for key in keys:
        fake_feishu.add_resource(event["event"]["message"]["message_id"], key, jpeg(64, 64), "image")

    status, _ = await fake_feishu.post_event(f"http://127.0.0.1:{gateway.http_port}/feishu/events", event)
    assert status == 200
    await wait_until(lambda: len(fake_feishu.sent(P2P)) >= before + 1, what="the reply")

    assert len(oa.image_parts(fake_openai.requests[0])) == 10
    assert len(list(fake_feishu.calls("resource"))) == 10  # the other three never downloaded
    text = fake_openai.requests[0]["json"]["messages"][-1]["content"][0]["text"]
    assert text.count("only the first 10 files of a message are read") == 3
    sent = " ".join(str(m) for m in fake_feishu.sent(P2P)[before:])
    assert "前 10 个文件，其余 3 个没有读取" in sent  # a Feishu chat without a language choice reads Chinese


async def test_a_sticker_is_described_to_the_model_without_asking_feishu_for_it(tmp_path, fake_feishu, fake_openai,
                                                                                running):
    """Feishu's resource API serves no stickers ("暂不支持获取表情包资源"): the gateway asked anyway,
    and a sticker sent alone got "⚠️ I could not use the sticker" and no answer (found by a review).
    Now it reaches the model as a described sticker, with no download attempt."""
    fake_feishu.reset()
    fake_openai.reset()
    fake_openai.script(oa.text("Nice sticker!"))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu), running)
    before = len(fake_feishu.sent(P2P))
    event = fake_feishu.text_event("", message_type="sticker", content={"file_key": "file_v3_fake_sticker"})

    status, _ = await fake_feishu.post_event(f"http://127.0.0.1:{gateway.http_port}/feishu/events", event)
    assert status == 200
    await wait_until(lambda: len(fake_feishu.sent(P2P)) >= before + 1, what="the reply")

    assert not list(fake_feishu.calls("resource"))
    assert len(fake_openai.requests) == 1
    user = fake_openai.requests[0]["json"]["messages"][-1]["content"]
    assert "[sticker" in str(user) and "could not be used" not in str(user)
    assert "could not use" not in " ".join(str(m) for m in fake_feishu.sent(P2P)[before:])
