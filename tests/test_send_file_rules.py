"""The pure rules behind ``send_file``: which platform call carries a file, what each platform
refuses (and the sentence the model reads), how a file is typed, and how the web chat shows it."""

from __future__ import annotations

import dataclasses

from adapters.feishu import files as feishu
from adapters.slack import files as slack
from adapters.telegram import files as telegram
from adapters.web.format import attachment_html
from gateway.core.files import human_size
from gateway.core.types import OutboundAttachment
from gateway.delivery.send_file import describe
from tests.sendfile_flows import png

PICTURE = OutboundAttachment(kind="image", name="chart.png", mime_type="image/png", size=50_000, sha256="a" * 64,
                             width=1200, height=800)


def test_telegram_sends_pictures_within_the_photo_rules_as_photos_and_the_rest_as_documents():
    assert telegram.as_photo(PICTURE)
    assert not telegram.as_photo(dataclasses.replace(PICTURE, size=10_000_001))  # over 10 MB
    assert not telegram.as_photo(dataclasses.replace(PICTURE, width=9000, height=1001))  # sides over 10,000
    assert not telegram.as_photo(dataclasses.replace(PICTURE, width=2100, height=100))  # ratio 21 > 20
    assert telegram.as_photo(dataclasses.replace(PICTURE, width=2000, height=100))  # ratio 20 is allowed
    assert not telegram.as_photo(dataclasses.replace(PICTURE, mime_type="image/gif"))  # plays as a document
    assert not telegram.as_photo(dataclasses.replace(PICTURE, kind="document"))
    assert telegram.attachment_problem(dataclasses.replace(PICTURE, size=50_000_000)) is None
    too_big = telegram.attachment_problem(dataclasses.replace(PICTURE, size=63_200_000))
    assert too_big == "Telegram bots can send files up to 50 MB (Bot API sendDocument); chart.png is 63.2 MB."
    assert telegram.attachment_problem(dataclasses.replace(PICTURE, size=63_200_000), 2000 * 10**6) is None
    assert "empty" in telegram.attachment_problem(dataclasses.replace(PICTURE, size=0))


def test_feishu_uses_the_image_api_within_its_limits_and_the_file_api_otherwise():
    assert feishu.as_image(PICTURE)
    assert not feishu.as_image(dataclasses.replace(PICTURE, size=10_000_001))
    assert not feishu.as_image(dataclasses.replace(PICTURE, width=12_001))
    assert not feishu.as_image(dataclasses.replace(PICTURE, mime_type="image/gif", width=2001, height=10))
    assert feishu.as_image(dataclasses.replace(PICTURE, mime_type="image/gif", width=2000, height=10))
    doc = dataclasses.replace(PICTURE, kind="document", mime_type="application/pdf", name="Report.PDF")
    assert [feishu.file_type(dataclasses.replace(doc, name=n)) for n in ("Report.PDF", "a.docx", "b.xlsx", "c.pptx",
                                                                         "d.mp4", "e.opus", "f.csv", "noext")] == [
        "pdf", "doc", "xls", "ppt", "mp4", "opus", "stream", "stream"]
    assert feishu.attachment_problem(dataclasses.replace(doc, size=30_000_000)) is None
    assert feishu.attachment_problem(dataclasses.replace(doc, size=30_000_001)) == \
        "Feishu takes files up to 30 MB (open API im/v1/files); Report.PDF is 30 MB."


def test_slack_takes_files_up_to_one_gigabyte():
    assert slack.attachment_problem(dataclasses.replace(PICTURE, size=1_000_000_000)) is None
    assert "up to 1000 MB" in slack.attachment_problem(dataclasses.replace(PICTURE, size=1_000_000_001))


def test_files_are_typed_by_their_bytes_not_their_names():
    picture = describe("out/chart.png", png(64, 48), "Sales")
    assert (picture.kind, picture.mime_type, picture.width, picture.height) == ("image", "image/png", 64, 48)
    assert (picture.name, picture.caption) == ("chart.png", "Sales")
    webp_named_png = describe("x.png", b"not a picture at all", "")
    assert (webp_named_png.kind, webp_named_png.mime_type) == ("document", "application/octet-stream")
    assert describe("t.csv", b"a,b\n", "").mime_type == "text/csv"
    assert describe("weird\x07name\n.txt", b"x", "").name == "weirdname.txt"  # control characters removed
    assert len(describe("a" * 300 + ".csv", b"x", "").name) == 255


def test_sizes_are_said_in_the_units_of_the_limits():
    assert [human_size(n) for n in (1, 12, 480_000, 50_000_000, 63_240_000)] == [
        "1 byte", "12 bytes", "480 KB", "50 MB", "63.2 MB"]


def test_the_web_chat_shows_only_raster_pictures_inline_and_escapes_names():
    image = attachment_html({"kind": "image", "name": "c.png", "mime_type": "image/png", "caption": "**hi**"},
                            "/web/files/x/c.png?type=image/png&sig=s")
    assert '<img src="/web/files/x/c.png?type=image/png&amp;sig=s"' in image and "<strong>hi</strong>" in image
    svg = attachment_html({"kind": "image", "name": "d.svg", "mime_type": "image/svg+xml", "size": 10}, "/u")
    assert "<img" not in svg and 'download="d.svg"' in svg  # SVG can carry script: a download only
    hostile = attachment_html({"kind": "document", "name": '<img src=x onerror=alert(1)>"', "size": 5}, "/u")
    assert "<img src=x" not in hostile and "&lt;img src=x onerror=alert(1)&gt;" in hostile
