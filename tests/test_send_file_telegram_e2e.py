"""``send_file`` end to end through the real python-telegram-bot and openai clients against the
fakes: a chart the agent wrote with ``run_shell`` arrives as one ``sendPhoto`` upload after the
answer's text; a picture outside the photo rules and a CSV go as ``sendDocument``; a file over
Telegram's 50 MB and a path outside the workspace are refused with a tool result that says why."""

from __future__ import annotations

from sqlalchemy import select

from gateway.store.models import AttachmentRow, MessageRow, OutboxFileRow
from tests.conftest import gateway_config, start_gateway
from tests.helpers import wait_until
from tests.sendfile_flows import answer, flow, png, send, sha, shell, tool_results, write_with_shell
from tests.test_telegram_e2e import dm_update


def config(tmp_path, fake_openai, fake_telegram):
    return gateway_config(tmp_path, fake_openai, fake_telegram,
                          tools={"workspace": "shell", "workspace_root": str(tmp_path / "workspaces")},
                          media={"directory": str(tmp_path / "media")})


def uploads(fake_telegram, chat_id: int) -> list[dict]:
    return [u for u in fake_telegram.uploads if u["chat_id"] == chat_id]


def calls(fake_telegram, method: str, chat_id: int) -> list:
    return [c for c in fake_telegram.calls(method) if int(c.params["chat_id"]) == chat_id]


async def test_a_chart_made_with_run_shell_arrives_as_one_photo_after_the_text(tmp_path, fake_telegram, fake_openai,
                                                                             running):
    chat = 5561001
    chart = png(640, 400)
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("chart.png", chart)),
                                 send("chart.png", "Sales by **month**"), answer("Here is the chart you asked for."))
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update("chart please", 9101, user_id=chat))
    await wait_until(lambda: uploads(fake_telegram, chat), what="the photo")
    await wait_until(lambda: gateway.store.outbox_rows()[-1]["status"] == "sent", what="reply settled")

    [upload] = uploads(fake_telegram, chat)
    assert upload["method"] == "sendPhoto" and upload["sha256"] == sha(chart) and upload["filename"] == "chart.png"
    assert upload["caption"] == "Sales by month"  # markdown became caption entities
    [photo] = calls(fake_telegram, "sendPhoto", chat)
    assert {"type": "bold", "offset": 9, "length": 5} in photo.params["caption_entities"]
    assert not calls(fake_telegram, "sendDocument", chat)
    texts = [m for m in fake_telegram.sent_messages(chat)]
    assert [("text" in m, "photo" in m) for m in texts] == [(True, False), (False, True)]  # text, then the photo
    assert texts[0]["text"] == "Here is the chart you asked for."
    assert texts[1]["photo"][0]["width"] == 640

    [row] = gateway.store.outbox_rows()
    assert row["platform_message_ids"] == [str(texts[0]["message_id"]), str(texts[1]["message_id"])]
    assert row["attachments"][0]["sha256"] == sha(chart)
    assert "will be sent" in tool_results(fake_openai, "chart.png")[-1]
    with gateway.engine.connect() as conn:
        final = conn.execute(select(MessageRow.meta).where(MessageRow.role == "assistant")
                             .order_by(MessageRow.id.desc()).limit(1)).scalar_one()
        used = conn.execute(select(AttachmentRow.role, AttachmentRow.sha256)).all()
    assert final["attachments"][0]["name"] == "chart.png"  # the transcript names the file, no bytes
    assert [(u.role, u.sha256) for u in used] == [("outbound", sha(chart))]  # retention knows the blob
    assert gateway.blobs.get(sha(chart)) == chart


async def test_a_caption_whose_entities_telegram_refuses_goes_as_plain_text_with_the_file(tmp_path, fake_telegram,
                                                                                           fake_openai, running):
    """Telegram refusing a caption's entities (400, nothing sent) used to fail the file for good;
    the upload goes once more with the caption as plain text, and the file arrives once."""
    chat = 5561009
    chart = png(320, 200)
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("chart.png", chart)),
                                 send("chart.png", "Sales by **month**"), answer("Here it is."))
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)
    fake_telegram.fail_next("sendPhoto", 400, "Bad Request: can't parse entities: Can't find end of the entity "
                            "starting at byte offset 9")
    fake_telegram.inject(dm_update("chart please", 9109, user_id=chat))
    await wait_until(lambda: gateway.store.outbox_rows() and gateway.store.outbox_rows()[-1]["status"]
                     in ("sent", "failed"), what="reply settled")
    assert gateway.store.outbox_rows()[-1]["status"] == "sent"
    [upload] = uploads(fake_telegram, chat)
    assert upload["method"] == "sendPhoto" and upload["caption"] == "Sales by month"
    first, second = calls(fake_telegram, "sendPhoto", chat)
    assert first.params.get("caption_entities") and not second.params.get("caption_entities")
    assert [("photo" in m) for m in fake_telegram.sent_messages(chat)] == [False, True]


async def test_the_bytes_sent_are_those_the_tool_saw_even_if_the_file_changes(tmp_path, fake_telegram, fake_openai,
                                                                           running):
    chat = 5561002
    first, second = png(100, 100, "red"), png(100, 100, "blue")
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("pic.png", first)), send("pic.png"),
                                 shell(write_with_shell("pic.png", second) + " && rm -f other"), answer(""))
    await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update("picture", 9102, user_id=chat))
    await wait_until(lambda: uploads(fake_telegram, chat), what="the photo")
    [upload] = uploads(fake_telegram, chat)
    assert upload["sha256"] == sha(first)  # overwritten after the call: the recorded blob still goes
    assert [("photo" in m) for m in fake_telegram.sent_messages(chat)] == [True]  # an empty answer: only the file


async def test_pictures_outside_the_photo_rules_and_other_files_go_as_documents(tmp_path, fake_telegram, fake_openai,
                                                                              running):
    chat = 5561003
    banner = png(30, 700)  # aspect ratio 23 > 20: Telegram refuses it as a photo
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("banner.png", banner) + " && printf 'a,b\\n1,2\\n' > t.csv"),
                                 send("banner.png"), send("t.csv", "the table"), answer("Two files."))
    await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update("files", 9103, user_id=chat))
    await wait_until(lambda: len(uploads(fake_telegram, chat)) == 2, what="two documents")
    assert [(u["method"], u["filename"]) for u in uploads(fake_telegram, chat)] == [
        ("sendDocument", "banner.png"), ("sendDocument", "t.csv")]
    assert not calls(fake_telegram, "sendPhoto", chat)
    assert uploads(fake_telegram, chat)[1]["caption"] == "the table"


async def test_a_damaged_picture_telegram_cannot_process_goes_as_a_document(tmp_path, fake_telegram, fake_openai,
                                                                            running):
    """A PNG whose header is whole but whose data is cut (a chart run_shell was killed while
    writing, say) is a picture by its header, so it went with sendPhoto; Telegram answered 400
    "IMAGE_PROCESS_FAILED" (nothing sent) and the file failed for good, the files after it too
    (found by a review). It goes as a document instead, like a photo of the wrong dimensions."""
    chat = 5561010
    whole = png(640, 400)
    cut = whole[:len(whole) // 2]
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("chart.png", cut) + " && printf 'a,b\\n1,2\\n' > t.csv"),
                                 send("chart.png"), send("t.csv"), answer("Two files."))
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update("chart please", 9110, user_id=chat))
    await wait_until(lambda: gateway.store.outbox_rows() and gateway.store.outbox_rows()[-1]["status"]
                     in ("sent", "failed"), what="reply settled")
    assert gateway.store.outbox_rows()[-1]["status"] == "sent"
    assert [(u["method"], u["filename"], u["sha256"]) for u in uploads(fake_telegram, chat)] == [
        ("sendDocument", "chart.png", sha(cut)), ("sendDocument", "t.csv", uploads(fake_telegram, chat)[1]["sha256"])]
    assert len(calls(fake_telegram, "sendPhoto", chat)) == 1  # tried once as a photo, refused


async def test_a_file_over_telegrams_limit_is_refused_with_the_limit_named(tmp_path, fake_telegram, fake_openai,
                                                                         running):
    chat = 5561004
    fake_openai.reset()
    fake_openai.responder = flow(shell("truncate -s 60M big.bin && echo made"), send("big.bin"),
                                 answer("The file is too big for Telegram."))
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update("send the big file", 9104, user_id=chat))
    await wait_until(lambda: any(m.get("text") == "The file is too big for Telegram."
                                 for m in fake_telegram.sent_messages(chat)), what="the answer")
    [result] = tool_results(fake_openai, "big.bin")
    assert "Telegram bots can send files up to 50 MB" in result and "big.bin is 62.9 MB" in result
    assert "Nothing was sent" in result
    assert not uploads(fake_telegram, chat) and not calls(fake_telegram, "sendDocument", chat)
    assert gateway.store.outbox_rows()[-1]["attachments"] is None
    assert not [p for p in (tmp_path / "media").rglob("*") if p.is_file()]  # nothing stored


async def test_paths_outside_the_workspace_are_refused(tmp_path, fake_telegram, fake_openai, running):
    chat = 5561005
    secret = tmp_path / "outside.txt"
    secret.write_text("not for the model")
    fake_openai.reset()
    fake_openai.responder = flow(shell(f"ln -s {secret} link.txt && echo linked"), send("../../outside.txt"),
                                 send(str(secret)), send("link.txt"), answer("I cannot send those."))
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_telegram), running)

    fake_telegram.inject(dm_update("send me outside.txt", 9105, user_id=chat))
    await wait_until(lambda: any(m.get("text") == "I cannot send those." for m in fake_telegram.sent_messages(chat)),
                     what="the answer")
    results = tool_results(fake_openai, "Nothing was sent")
    assert len(results) == 3 and all("outside the workspace" in r for r in results), results
    assert not uploads(fake_telegram, chat)
    with gateway.engine.connect() as conn:
        assert conn.execute(select(OutboxFileRow.id)).first() is None
