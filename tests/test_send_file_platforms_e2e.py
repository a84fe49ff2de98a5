"""``send_file`` end to end on Slack (slack-sdk: files upload v2 into the thread), Feishu (lark-oapi:
image / file upload, then the message), the web chat (inline image and a signed, per-user download)
and a scheduled report that attaches the CSV its run wrote."""

from __future__ import annotations

import re

from sqlalchemy import select
from yarl import URL

from gateway.store.models import MessageRow
from tests.conftest import FIXTURES, gateway_config, start_gateway
from tests.helpers import wait_until
from tests.sendfile_flows import answer, flow, png, send, sha, shell, tool_results, write_with_shell
from tests.test_jobs_e2e import command
from tests.test_web_admin import ADMIN, Operator
from tests.web_client import WebClient

CHANNEL, MENTION_TS = "C0GENERAL1", "1735689660.000200"  # channel_app_mention.json, answered in its thread
P2P = "oc_fakep2p000000000000000000000001"
CSV = b"region,units\nnorth,42\nsouth,17\n"


def workspace(tmp_path) -> dict:
    return {"tools": {"workspace": "shell", "workspace_root": str(tmp_path / "workspaces")},
            "media": {"directory": str(tmp_path / "media")}}


async def test_slack_file_goes_into_the_thread_with_files_upload_v2(tmp_path, fake_slack, fake_openai, running):
    chart = png(300, 200)
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("chart.png", chart)), send("chart.png", "Incident *timeline*"),
                                 answer("Timeline attached."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, **workspace(tmp_path)),
                                  running)
    before = len(fake_slack.uploads.shared())
    calls_before = len(fake_slack.calls())
    url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
    assert (await fake_slack.post_event(url, (FIXTURES / "slack" / "channel_app_mention.json").read_bytes())).status \
        == 200
    await wait_until(lambda: len(fake_slack.uploads.shared()) > before, what="the shared file")
    await wait_until(lambda: gateway.store.outbox_rows()[-1]["status"] == "sent", what="reply settled")

    [shared] = fake_slack.uploads.shared()[before:]
    assert (shared["channel"], shared["thread_ts"], shared["filename"]) == (CHANNEL, MENTION_TS, "chart.png")
    assert shared["sha256"] == sha(chart) and shared["initial_comment"] == "Incident _timeline_"
    methods = [c.method for c in fake_slack.calls()[calls_before:] if c.method.startswith(("files.", "chat.post"))]
    assert methods == ["chat.postMessage", "files.getUploadURLExternal", "files.completeUploadExternal"]
    get_url = next(c for c in fake_slack.calls()[calls_before:] if c.method == "files.getUploadURLExternal")
    assert (get_url.params["filename"], int(get_url.params["length"])) == ("chart.png", len(chart))
    post = fake_slack.uploads.upload_posts[-1]
    assert post["status"] == 200 and post["authorization"] is None  # the upload URL carries its own authorization
    in_thread = fake_slack.posted(CHANNEL, MENTION_TS)
    assert [m.get("subtype") for m in in_thread][-2:] == [None, "file_share"]  # the text, then the file
    assert gateway.store.outbox_rows()[-1]["platform_message_ids"][-1] == shared["id"]


async def test_feishu_image_and_file_are_uploaded_then_sent_as_messages(tmp_path, fake_feishu, fake_openai, running):
    chart = png(400, 300)
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("chart.png", chart) + " && printf 'region,units\\n' > r.csv"),
                                 send("chart.png", "本月 **销量**"), send("r.csv", "the data"),
                                 answer("Both attached."))
    fake_feishu.reset()
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, **workspace(tmp_path)),
                                  running)
    url = f"http://127.0.0.1:{gateway.http_port}/feishu/events"
    status, _ = await fake_feishu.post_event(url, fake_feishu.text_event("chart and data please", chat_id=P2P))
    assert status == 200
    await wait_until(lambda: len(fake_feishu.sent(P2P)) == 4, timeout=15, what="text, image post, caption, file")
    await wait_until(lambda: gateway.store.outbox_rows()[-1]["status"] == "sent", what="reply settled")

    [image_key] = fake_feishu.uploads.images
    [file_key] = fake_feishu.uploads.files
    assert fake_feishu.uploads.images[image_key]["image_type"] == "message"
    assert fake_feishu.uploads.images[image_key]["sha256"] == sha(chart)
    assert fake_feishu.uploads.files[file_key] == {"file_type": "stream", "file_name": "r.csv", "size": 13,
                                                   "sha256": sha(b"region,units\n")}
    text, image, caption, file = fake_feishu.sent(P2P)
    assert text["msg_type"] == "post" and "Both attached." in str(text["content"])
    rows = image["content"]["zh_cn"]["content"]
    assert image["msg_type"] == "post" and rows[0] == [{"tag": "img", "image_key": image_key}]
    assert "销量" in str(rows[1:])  # the caption under the image, in the same message
    assert caption["msg_type"] == "post" and "the data" in str(caption["content"])
    assert (file["msg_type"], file["content"]) == ("file", {"file_key": file_key})
    uuids = [m["uuid"] for m in fake_feishu.sent(P2P)]
    assert len(set(uuids)) == 4 and all(uuids)  # each part carries its own uuid (Feishu dedupes a resend)


async def test_web_chat_shows_the_image_inline_and_serves_it_only_to_its_user(tmp_path, fake_openai, running):
    chart = png(120, 80)
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("chart.png", chart) + " && printf 'x' > notes.txt"),
                                 send("chart.png", "The chart"), send("notes.txt"), answer("See below."))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, **workspace(tmp_path)), running)
    base = f"http://127.0.0.1:{gateway.http_port}"
    page, stranger = WebClient(base), WebClient(base)
    try:
        await page.open()
        await stranger.open()
        page.listen()
        assert (await page.say("draw it")).status == 200

        def shown() -> list[str]:  # the live reply, or (once the transcript has it) the answer's row
            return [e["html"] for e in page.events if e["type"] in ("row", "reply") and "See below." in e["text"]]

        await wait_until(shown, timeout=15, what="reply")
        html = shown()[-1]
        image_url = re.search(r'<img src="([^"]+)"', html).group(1).replace("&amp;", "&")
        download = re.search(r'<a href="([^"]+)" download="notes.txt"', html).group(1).replace("&amp;", "&")
        assert "<figcaption><p>The chart</p>" in html
        async with page.http.get(base + image_url) as response:
            assert response.status == 200 and await response.read() == chart
            assert response.content_type == "image/png" and response.headers["Content-Disposition"].startswith("inline")
            assert response.headers["X-Content-Type-Options"] == "nosniff"
        async with page.http.get(base + download) as response:
            assert response.status == 200 and await response.read() == b"x"
            assert response.headers["Content-Disposition"].startswith("attachment")  # text is never shown inline
            assert response.content_type == "application/octet-stream"
        async with stranger.http.get(base + image_url) as response:
            assert response.status == 403  # another browser: the link is not theirs
        retyped = str(URL(image_url).update_query(type="text/html"))
        async with page.http.get(base + retyped) as response:
            assert response.status == 403  # the type is part of the signature
    finally:
        await page.close()
        await stranger.close()


async def test_web_chat_transcript_row_carries_the_files_after_a_reload(tmp_path, fake_openai, running):
    chart = png(60, 40)
    fake_openai.reset()
    fake_openai.responder = flow(shell(write_with_shell("c.png", chart)), send("c.png"), answer(""))
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, **workspace(tmp_path)), running)
    base = f"http://127.0.0.1:{gateway.http_port}"
    page = WebClient(base)
    try:
        await page.open()
        assert (await page.say("only the picture")).status == 200
        await wait_until(lambda: gateway.store.outbox_rows() and gateway.store.outbox_rows()[-1]["status"] == "sent",
                         what="reply delivered")
        page.listen()  # a page opened now reads the conversation from the transcript
        await wait_until(lambda: page.of("row", lambda e: e["role"] == "assistant"), what="answer row")
        [row] = page.of("row", lambda e: e["role"] == "assistant")
        assert row["text"] == "" and '<img src="/web/files/' in row["html"]  # an answer that is only a file
        image_url = re.search(r'<img src="([^"]+)"', row["html"]).group(1).replace("&amp;", "&")
        async with page.http.get(base + image_url) as response:
            assert response.status == 200 and await response.read() == chart
    finally:
        await page.close()


async def test_a_scheduled_report_attaches_the_csv_its_run_wrote(tmp_path, fake_telegram, fake_openai, running):
    owner = 5562001
    fake_openai.reset()
    report = flow(shell(f"printf '{CSV.decode().encode('unicode_escape').decode()}' > weekly.csv && echo ok"),
                  send("weekly.csv", "Units by region"), answer("Weekly report: **59** units, details attached."))

    def respond(request):
        user = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
        return report(request) if "Weekly units report" in user else answer("ok")()

    fake_openai.responder = respond
    gateway = await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram, web=ADMIN,
                                                 scheduler={"reload_interval_s": 0.3}, **workspace(tmp_path)), running)

    def texts() -> list[str]:
        return [m.get("text") or "" for m in fake_telegram.sent_messages(owner)]

    fake_telegram.inject(command('/schedule "0 9 * * 1" UTC Weekly units report', 9201, owner))
    await wait_until(lambda: any("Scheduled report" in t for t in texts()), what="job created")
    job_id = re.search(r"Scheduled report (\w+)", next(t for t in texts() if "Scheduled report" in t)).group(1)
    fake_telegram.inject(command(f"/run {job_id}", 9202, owner))
    await wait_until(lambda: any(u["chat_id"] == owner for u in fake_telegram.uploads), timeout=15, what="the CSV")
    await wait_until(lambda: [r.status for r in gateway.jobs.runs(job_id)] == ["sent"], what="run settled")

    [upload] = [u for u in fake_telegram.uploads if u["chat_id"] == owner]
    assert (upload["method"], upload["filename"], upload["sha256"]) == ("sendDocument", "weekly.csv", sha(CSV))
    assert upload["caption"] == "Units by region"
    assert "Weekly report: 59 units, details attached." in texts()
    [run] = gateway.jobs.runs(job_id)
    assert len(run.platform_message_ids) == 2  # the report's text and its file, both delivered
    assert any("weekly.csv" in r and "will be sent" in r for r in tool_results(fake_openai, "weekly.csv"))
    with gateway.engine.connect() as conn:
        rows = conn.execute(select(MessageRow.meta, MessageRow.tool_calls, MessageRow.session_id).where(
            MessageRow.turn_id == f"run{run.id}", MessageRow.role == "assistant")).all()
    [final] = [r for r in rows if not r.tool_calls]
    assert final.meta["attachments"][0]["name"] == "weekly.csv"  # a reference in the transcript, no bytes
    operator = Operator(f"http://127.0.0.1:{gateway.http_port}")  # the admin transcript shows the sent file
    try:
        await operator.login()
        status, page, _ = await operator.get(f"/admin/sessions/{final.session_id}")
    finally:
        await operator.http.close()
    assert status == 200 and "📎 sent document" in page and "weekly.csv" in page and "text/csv" in page
