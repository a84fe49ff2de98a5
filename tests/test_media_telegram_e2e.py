"""Photos, albums and files from Telegram to the model, end to end: the real python-telegram-bot
(``getFile`` + ``/file/bot<token>/<path>``) and openai clients against the loopback fakes; the fake
OpenAI validates image content parts as the real API does."""

from __future__ import annotations

import asyncio
import io
import time
from typing import Any

from PIL import Image
from sqlalchemy import func, select

from gateway.store.models import AttachmentRow, InboxRow, MessageRow
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until


def jpeg(width: int, height: int, color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "JPEG", quality=90)
    return out.getvalue()


def photo_update(user_id: int, message_id: int, sizes: list[tuple[str, int, int, int]], caption: str | None = None,
                 group: str | None = None) -> dict[str, Any]:
    """A DM carrying a photo; ``sizes``: ``(file_id, width, height, file_size)`` as Telegram lists them."""
    message: dict[str, Any] = {
        "message_id": message_id, "date": int(time.time()),
        "from": {"id": user_id, "is_bot": False, "first_name": "Alice"},
        "chat": {"id": user_id, "first_name": "Alice", "type": "private"},
        "photo": [{"file_id": f, "file_unique_id": f"u{f}"[:32], "width": w, "height": h, "file_size": n}
                  for f, w, h, n in sizes],
    }
    if caption is not None:
        message["caption"] = caption
    if group is not None:
        message["media_group_id"] = group
    return {"message": message}


def document_update(user_id: int, message_id: int, file_id: str, name: str, mime: str, size: int,
                    caption: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "message_id": message_id, "date": int(time.time()),
        "from": {"id": user_id, "is_bot": False, "first_name": "Alice"},
        "chat": {"id": user_id, "first_name": "Alice", "type": "private"},
        "document": {"file_id": file_id, "file_unique_id": f"u{file_id}"[:32], "file_name": name,
                     "mime_type": mime, "file_size": size},
    }
    if caption is not None:
        message["caption"] = caption
    return {"message": message}


def replies_to(fake, chat_id: int) -> list:
    return [c for c in fake.calls("sendMessage") if int(c.params["chat_id"]) == chat_id]


def requests_of(fake_openai, marker: str) -> list[dict[str, Any]]:
    return [r["json"] for r in fake_openai.requests if r["status"] == 200 and marker in str(r["json"])]


async def test_photo_with_caption_is_one_request_with_the_image_and_the_caption(tmp_path, fake_telegram, fake_openai,
                                                                               running):
    fake_openai.reset()
    fake_openai.script(oa.text("A red square."))
    big = jpeg(3000, 2000)
    fake_telegram.add_file("ph-small", jpeg(90, 60))
    fake_telegram.add_file("ph-large", big)
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(photo_update(5560001, 10, [("ph-small", 90, 60, 1000), ("ph-large", 3000, 2000, len(big))],
                                      caption="what colour is this?"))
    reply = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5560001)

    assert reply.params["text"] == "A red square."
    chats = [r for r in fake_openai.requests if r["json"] and "what colour is this?" in str(r["json"])]
    assert len(chats) == 1 and chats[0]["status"] == 200  # one model request
    user = chats[0]["json"]["messages"][-1]
    assert user["role"] == "user" and isinstance(user["content"], list)
    text = [p["text"] for p in user["content"] if p["type"] == "text"]
    assert len(text) == 1 and text[0].endswith("what colour is this?") and "[image unnamed (image/jpeg" in text[0]
    images = oa.image_parts(chats[0])
    assert len(images) == 1 and images[0][0] == "image/jpeg"
    shown = Image.open(io.BytesIO(images[0][1]))
    assert shown.size == (2048, 1365)  # the longest side scaled to media.image_max_side
    assert [c.params["file_id"] for c in fake_telegram.calls("getFile")] == ["ph-large"]  # the largest size only


async def test_an_album_of_three_is_one_turn(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("Three pictures."))
    for n, color in enumerate([(255, 0, 0), (0, 255, 0), (0, 0, 255)]):
        fake_telegram.add_file(f"alb-{n}", jpeg(640, 480, color))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)

    for n in range(3):  # Telegram sends an album as one message per item; the caption is on the first
        fake_telegram.inject(photo_update(5560002, 20 + n, [(f"alb-{n}", 640, 480, 30_000)],
                                          caption="compare these" if n == 0 else None, group="album-1"))
    await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5560002)
    await wait_until(lambda: not fake_openai.pending, what="the scripted reply used")

    chats = requests_of(fake_openai, "compare these")
    assert len(chats) == 1
    assert len(oa.image_parts({"json": chats[0]})) == 3
    assert len(replies_to(fake_telegram, 5560002)) == 1


async def test_a_30_mb_file_gets_one_clear_reply_naming_the_limit_and_no_model_call(tmp_path, fake_telegram,
                                                                                     fake_openai, running):
    fake_openai.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    before = len(fake_telegram.calls("getFile"))

    fake_telegram.inject(document_update(5560003, 30, "big-doc", "backup.zip", "application/zip", 30_000_000))
    reply = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5560003)

    assert '"backup.zip"' in reply.params["text"] and "30.0 MB" in reply.params["text"]
    assert "Telegram bots can take files up to 20 MB" in reply.params["text"]
    assert fake_openai.requests == []  # no model request at all, so no empty user message
    assert len(fake_telegram.calls("getFile")) == before  # refused from the size the update declared
    assert len(replies_to(fake_telegram, 5560003)) == 1
    with gateway.engine.connect() as conn:
        rows = conn.execute(select(MessageRow.role, MessageRow.meta).order_by(MessageRow.id)).all()
    assert [r.role for r in rows] == ["user", "assistant"]
    assert "too big" in rows[0].meta["attachments"][0]["note"]


async def test_a_file_with_text_still_answers_the_text_and_says_what_was_refused(tmp_path, fake_telegram,
                                                                                 fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("Here is my answer."))
    out = io.BytesIO()
    Image.effect_noise((400, 300), 50).convert("RGB").save(out, "JPEG")
    fake_telegram.add_file("broken-photo", out.getvalue()[:out.tell() // 2])  # cut off half-way
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(photo_update(5560004, 40, [("broken-photo", 800, 600, 204)], caption="and this one?"))
    reply = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5560004)

    assert reply.params["text"].startswith("⚠️ I could not use the image: the image is damaged or incomplete")
    assert reply.params["text"].endswith("Here is my answer.")
    sent = requests_of(fake_openai, "and this one?")
    assert len(sent) == 1 and oa.image_parts({"json": sent[0]}) == []
    assert "could not be used: the image is damaged" in sent[0]["messages"][-1]["content"]


async def test_vision_off_tells_the_user_and_runs_the_turn_on_the_text(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.script(oa.text("From your words: a cat."))
    fake_telegram.add_file("cat-photo", jpeg(800, 600))
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, llm={"vision": False}), running)

    fake_telegram.inject(photo_update(5560005, 50, [("cat-photo", 800, 600, 20_000)], caption="my cat, cute?"))
    reply = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5560005)

    assert "This model cannot see images" in reply.params["text"]
    assert reply.params["text"].endswith("From your words: a cat.")
    sent = requests_of(fake_openai, "my cat, cute?")
    assert len(sent) == 1 and oa.image_parts({"json": sent[0]}) == []
    assert "this model cannot see images" in sent[0]["messages"][-1]["content"]


async def test_a_model_that_refuses_images_gets_the_text_and_the_user_a_note(tmp_path, fake_telegram, fake_openai,
                                                                            running):
    fake_openai.reset()
    fake_openai.vision_models = {"gpt-4o"}  # the configured gpt-4o-mini answers 400 to image parts
    fake_openai.script(oa.text("Answered from the text."), oa.text("Second answer."))
    fake_telegram.add_file("dog-photo", jpeg(800, 600))
    try:
        await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
        fake_telegram.inject(photo_update(5560006, 60, [("dog-photo", 800, 600, 20_000)], caption="a dog?"))
        reply = await fake_telegram.wait_for_call("sendMessage", lambda c: int(c.params["chat_id"]) == 5560006)
        statuses = [r["status"] for r in fake_openai.requests]
        assert statuses == [400, 200]
        assert "This model cannot see images" in reply.params["text"]
        assert reply.params["text"].endswith("Answered from the text.")

        # Remembered: the next image goes as text at once (no failing request first).
        fake_telegram.inject(photo_update(5560006, 61, [("dog-photo", 800, 600, 20_000)], caption="again?"))
        await wait_until(lambda: len(replies_to(fake_telegram, 5560006)) == 2, what="second reply")
        assert [r["status"] for r in fake_openai.requests] == [400, 200, 200]
        assert "This model cannot see images" in replies_to(fake_telegram, 5560006)[-1].params["text"]
    finally:
        fake_openai.vision_models = None


async def test_a_session_with_50_images_loads_without_reading_a_blob(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("ok")
    for n in range(50):
        fake_telegram.add_file(f"many-{n}", jpeg(64, 64, (n * 5, 0, 0)))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram,
                                                 media={"directory": str(tmp_path / "media"), "history_images": 4}),
                                  running)
    for n in range(50):
        fake_telegram.inject(photo_update(5560007, 100 + n, [(f"many-{n}", 64, 64, 2000)], caption=f"picture {n}"))
        await wait_until(lambda n=n: len(replies_to(fake_telegram, 5560007)) == n + 1, timeout=20,
                         what=f"reply {n}")
    with gateway.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(AttachmentRow)).scalar() == 100  # originals + renditions

    # Loading the session (what a turn, the web chat and the admin pages read) touches no blob.
    reads = gateway.blobs.reads
    with gateway.engine.connect() as conn:
        key = conn.execute(select(InboxRow.session_key).where(InboxRow.platform_message_id == "5560007:100")).scalar()
    opened = gateway.store.open_session(key, lambda: "", 200, None)
    assert len(opened.window) == 100 and gateway.blobs.reads == reads

    # A text turn sends the newest history_images images only, reading just those blobs.
    fake_telegram.inject({"message": {"message_id": 999, "date": int(time.time()), "text": "which was first?",
                                      "from": {"id": 5560007, "is_bot": False, "first_name": "Alice"},
                                      "chat": {"id": 5560007, "type": "private", "first_name": "Alice"}}})
    await wait_until(lambda: len(replies_to(fake_telegram, 5560007)) == 51, what="the text turn's reply")
    last = requests_of(fake_openai, "which was first?")[-1]
    assert len(oa.image_parts({"json": last})) == 4
    assert gateway.blobs.reads - reads == 4
    assert "picture 0" in str(last)  # older pictures are still described in words



async def test_forget_files_deletes_the_users_files_and_later_turns_say_so(tmp_path, fake_telegram, fake_openai,
                                                                          running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("seen")
    fake_telegram.add_file("private-photo", jpeg(400, 300))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(photo_update(5560008, 70, [("private-photo", 400, 300, 9000)], caption="keep this?"))
    await wait_until(lambda: len(replies_to(fake_telegram, 5560008)) == 1, what="the photo's reply")

    def command(text: str, message_id: int) -> dict[str, Any]:
        return {"message": {"message_id": message_id, "date": int(time.time()), "text": text,
                            "entities": [{"type": "bot_command", "offset": 0, "length": len(text)}],
                            "from": {"id": 5560008, "is_bot": False, "first_name": "Alice"},
                            "chat": {"id": 5560008, "type": "private", "first_name": "Alice"}}}

    fake_telegram.inject(command("/files", 71))
    await wait_until(lambda: len(replies_to(fake_telegram, 5560008)) == 2, what="/files")
    assert replies_to(fake_telegram, 5560008)[-1].params["text"].startswith("I keep 1 file you sent")
    fake_telegram.inject(command("/forget_files", 72))
    await wait_until(lambda: len(replies_to(fake_telegram, 5560008)) == 3, what="/forget_files")
    assert replies_to(fake_telegram, 5560008)[-1].params["text"].startswith("Deleted 1 stored file you sent")
    with gateway.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(AttachmentRow)).scalar() == 0
    assert [p for p in (tmp_path / "media").rglob("*") if p.is_file()] == []

    fake_telegram.inject({"message": {"message_id": 73, "date": int(time.time()), "text": "what was in it?",
                                      "from": {"id": 5560008, "is_bot": False, "first_name": "Alice"},
                                      "chat": {"id": 5560008, "type": "private", "first_name": "Alice"}}})
    await wait_until(lambda: len(replies_to(fake_telegram, 5560008)) == 4, what="the next turn")
    last = requests_of(fake_openai, "what was in it?")[-1]
    assert oa.image_parts({"json": last}) == [] and "this image is no longer stored" in str(last)


async def test_files_sent_before_a_link_are_the_linked_users_and_forget_files_deletes_them(
        tmp_path, fake_telegram, fake_openai, running):
    """Files follow the account that joins with /link, as its conversations and memory do: they
    stayed with the joining account's old user, so /forget_files from the linked user said
    "nothing to delete" and kept them."""
    import re

    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("seen")
    fake_telegram.add_file("joining-photo", jpeg(400, 300))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    joining, staying = 5560018, 5560019

    def command(text: str, message_id: int, user_id: int) -> dict[str, Any]:
        return {"message": {"message_id": message_id, "date": int(time.time()), "text": text,
                            "entities": [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}],
                            "from": {"id": user_id, "is_bot": False, "first_name": "Alice"},
                            "chat": {"id": user_id, "type": "private", "first_name": "Alice"}}}

    fake_telegram.inject(photo_update(joining, 80, [("joining-photo", 400, 300, 9000)], caption="keep this?"))
    await wait_until(lambda: len(replies_to(fake_telegram, joining)) == 1, what="the photo's reply")
    fake_telegram.inject(command("/link", 81, staying))
    await wait_until(lambda: len(replies_to(fake_telegram, staying)) == 1, what="the link code")
    code = re.search(r"/link ([A-Z0-9]{5}-[A-Z0-9]{5})", replies_to(fake_telegram, staying)[0].params["text"]).group(1)
    fake_telegram.inject(command(f"/link {code}", 82, joining))
    await wait_until(lambda: len(replies_to(fake_telegram, joining)) == 2, what="linked")
    assert replies_to(fake_telegram, joining)[-1].params["text"].startswith("Linked.")

    fake_telegram.inject(command("/files", 83, staying))
    await wait_until(lambda: len(replies_to(fake_telegram, staying)) == 2, what="/files")
    assert replies_to(fake_telegram, staying)[-1].params["text"].startswith("I keep 1 file you sent")
    fake_telegram.inject(command("/forget_files", 84, joining))
    await wait_until(lambda: len(replies_to(fake_telegram, joining)) == 3, what="/forget_files")
    assert replies_to(fake_telegram, joining)[-1].params["text"].startswith("Deleted 1 stored file you sent")
    with gateway.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(AttachmentRow)).scalar() == 0
    assert [p for p in (tmp_path / "media").rglob("*") if p.is_file()] == []


async def test_deleting_a_session_deletes_its_files(tmp_path, fake_telegram, fake_openai, running, monkeypatch,
                                                    capsys):
    from gateway.app.cli import main

    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("ok")
    fake_telegram.add_file("session-photo", jpeg(300, 200))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.inject(photo_update(5560009, 80, [("session-photo", 300, 200, 5000)], caption="hold this"))
    await wait_until(lambda: len(replies_to(fake_telegram, 5560009)) == 1, what="the reply")
    with gateway.engine.connect() as conn:
        session_id = conn.execute(select(MessageRow.session_id).where(MessageRow.role == "user")).scalar()
    assert [p for p in (tmp_path / "media").rglob("*") if p.is_file()]

    monkeypatch.setenv("GATEWAY__DATABASE__URL", f"sqlite:///{tmp_path / 'gateway.db'}")
    monkeypatch.setenv("GATEWAY__MEDIA__DIRECTORY", str(tmp_path / "media"))
    assert await asyncio.to_thread(main, ["sessions", "delete", session_id[:10]]) == 0
    assert "deleted 1 stored file(s)" in capsys.readouterr().out
    with gateway.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(MessageRow)
                            .where(MessageRow.session_id == session_id)).scalar() == 0
        assert conn.execute(select(func.count()).select_from(AttachmentRow)).scalar() == 0
    assert [p for p in (tmp_path / "media").rglob("*") if p.is_file()] == []
