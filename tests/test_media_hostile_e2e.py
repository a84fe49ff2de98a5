"""Hostile files a chat user can send, through the real python-telegram-bot and openai clients
against the loopback fakes: each is answered with a note within the reader's limits and the chat
goes on. Images and documents are read in child processes (``gateway.media.isolated``) with a
time limit and a memory cap; before, a 5 KB PDF held a turn (and its chat) for about 12 hours, a
100 KB Word file took gigabytes of the gateway's memory, and a 60,000,000 x 1 PNG made the turn
fail three times with only the generic apology."""

from __future__ import annotations

import io
import struct
import time
import zipfile
import zlib
from typing import Any

import pytest

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_media_telegram_e2e import document_update, replies_to


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def long_png(width: int = 60_000_000) -> bytes:
    """A ``width`` x 1 RGBA PNG of about 230 KB: under the pixel cap, but resizing it to the model's
    side needs a table past what Pillow can allocate (``MemoryError``)."""
    pixels = zlib.compress(b"\x00" * (width * 4 + 1), 9)
    header = struct.pack(">IIBBBBB", width, 1, 8, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", pixels) + _png_chunk(b"IEND", b"")


def slow_pdf(invocations: int = 5000, operators: int = 1_900_000) -> bytes:
    """One page drawing one form ``invocations`` times; the form is a compressed stream of about
    two million operators, which pypdf parses again for each drawing (hours of CPU for 5 KB)."""
    form_ops = zlib.compress(b"BT () Tj ET\n" + b"q\n" * operators, 9)
    page_ops = zlib.compress(b"BT () Tj ET\n" + b"/X0 Do\n" * invocations, 9)
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 5 0 R >> "
        b"/XObject << /X0 4 0 R >> >> /Contents 6 0 R >>",
        b"<< /Type /XObject /Subtype /Form /BBox [0 0 10 10] /Filter /FlateDecode /Resources << /Font << /F1 5 0 R "
        b">> >> /Length %d >>\nstream\n" % len(form_ops) + form_ops + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Filter /FlateDecode /Length %d >>\nstream\n" % len(page_ops) + page_ops + b"\nendstream",
    ]
    out, offsets = bytearray(b"%PDF-1.7\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def wide_docx(paragraphs: int = 8_000_000) -> bytes:
    """A Word file of ``paragraphs`` empty paragraphs: about 70 KB zipped, some 30 MB of XML that
    python-docx builds into a tree of gigabytes."""
    ns = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    body = f'<?xml version="1.0"?><w:document {ns}><w:body>'.encode() + b"<w:p/>" * paragraphs + \
        b"</w:body></w:document>"
    members = {
        "[Content_Types].xml": '<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/'
                               'content-types"><Default Extension="rels" ContentType="application/vnd.openxmlformats-'
                               'package.relationships+xml"/><Override PartName="/word/document.xml" ContentType='
                               '"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
                               '</Types>',
        "_rels/.rels": '<?xml version="1.0"?><Relationships xmlns="http://schemas.openxmlformats.org/package/2006/'
                       'relationships"><Relationship Id="rId1" Type="http://schemas.openxmlformats.org/'
                       'officeDocument/2006/relationships/officeDocument" Target="word/document.xml"/>'
                       '</Relationships>',
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, text in members.items():
            archive.writestr(name, text)
        archive.writestr("word/document.xml", body)
    return buffer.getvalue()


def _rss() -> int:
    """This process's resident memory, bytes (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def _text_update(chat: int, message_id: int, text: str) -> dict[str, Any]:
    return {"message": {"message_id": message_id, "date": int(time.time()),
                        "from": {"id": chat, "is_bot": False, "first_name": "A"},
                        "chat": {"id": chat, "first_name": "A", "type": "private"}, "text": text}}


async def test_hostile_files_get_a_note_and_the_chat_goes_on(tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("answered")
    files = {"slow-pdf": (slow_pdf(), "invoice.pdf", "application/pdf"),
             "wide-docx": (wide_docx(), "notes.docx",
                           "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
             "long-png": (long_png(), "banner.png", "image/png")}
    assert all(len(data) < 400_000 for data, _, _ in files.values())
    for file_id, (data, _, _) in files.items():
        fake_telegram.add_file(file_id, data)
    config = gateway_config(tmp_path, fake_openai, fake_telegram,
                            media={"reader_timeout_s": 3, "reader_memory_mb": 400, "reader_processes": 2})
    gateway = await start_gateway(config, running)
    rss_before = _rss()
    started = time.monotonic()
    for chat, file_id in ((5570101, "slow-pdf"), (5570102, "wide-docx"), (5570103, "long-png")):
        data, name, mime = files[file_id]
        fake_telegram.inject(document_update(chat, 1, file_id, name, mime, len(data), caption="what is in it?"))
        fake_telegram.inject(_text_update(chat, 2, "hello?"))

    chats = (5570101, 5570102, 5570103)
    await wait_until(lambda: all(len(replies_to(fake_telegram, c)) >= 2 for c in chats), timeout=60,
                     what="each file answered with a note, then the next message")
    assert time.monotonic() - started < 30
    notes = {c: replies_to(fake_telegram, c)[0].params["text"] for c in chats}
    assert "took longer than 3 s, so it was given up" in notes[5570101], notes
    assert any(why in notes[5570102] for why in ("more memory than this gateway gives one file",  # or libxml2's
                                                  "took longer than 3 s", "seems damaged")), notes  # out of memory
    assert "could not use" in notes[5570103] and "banner.png" in notes[5570103], notes
    for chat in chats:
        assert notes[chat].endswith("answered")  # the caption answered with the note
        assert replies_to(fake_telegram, chat)[1].params["text"] == "answered"  # the chat goes on
    assert _rss() - rss_before < 300 << 20  # the gateway's own memory untouched
    assert len(gateway.media_readers.pids()) <= 2


async def test_a_documents_title_and_a_files_name_are_redacted_like_its_text(tmp_path, fake_telegram, fake_openai,
                                                                            running):
    """The text of a document was redacted, but its HTML ``<title>`` (shown as the document's
    detail) and the file's name reached the model as sent: the bot token in either leaked."""
    from tests.conftest import TEST_TOKEN

    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("read it")
    page = f"<html><head><title>debug {TEST_TOKEN}</title></head><body><p>hello {TEST_TOKEN}</p></body></html>"
    fake_telegram.add_file("token-page", page.encode())
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    chat = 5570111
    name = f"dump-{TEST_TOKEN}.html"
    fake_telegram.inject(document_update(chat, 1, "token-page", name, "text/html", len(page), caption="what is it?"))
    await wait_until(lambda: replies_to(fake_telegram, chat), what="the answer")
    sent = str(fake_openai.requests[-1]["json"]["messages"])
    assert "hello ***" in sent and "debug ***" in sent, sent[-1500:]
    assert TEST_TOKEN not in sent and TEST_TOKEN.split(":")[1] not in sent


def test_a_jpeg_of_hundreds_of_repeated_scans_is_refused_before_it_is_decoded():
    """libjpeg decodes every scan of a progressive JPEG: a 8000 x 8000 one whose last scan is
    repeated 1,000 times (346 KB) cost 56 s of CPU. Real progressive JPEGs have about ten scans."""
    from PIL import Image

    from gateway.core.errors import MediaError
    from gateway.media.images import prepare_image

    out = io.BytesIO()
    Image.new("RGB", (400, 300), (9, 9, 9)).save(out, "JPEG", progressive=True)
    normal = out.getvalue()
    assert 5 < normal.count(b"\xff\xda") < 20 and prepare_image(normal).width == 400
    last_scan = normal[normal.rfind(b"\xff\xda"):-2]
    hostile = normal[:-2] + last_scan * 150 + b"\xff\xd9"
    with pytest.raises(MediaError, match="built of 160 scans"):
        prepare_image(hostile)


def test_a_file_waiting_for_busy_readers_gets_a_note_after_one_files_time():
    """With every reader process busy (here: its one slot held, as a hostile file would hold it),
    another file waits at most the readers' time limit for one, then gets a note: one user's flood
    of files cannot hold everyone's. A file sent once a reader is free is read as usual."""
    from gateway.core.errors import MediaError
    from gateway.media.isolated import MediaReaders

    readers = MediaReaders(processes=1, timeout_s=1)
    try:
        held = readers._slots.get()  # the only reader, busy
        started = time.monotonic()
        with pytest.raises(MediaError, match="busy reading other files; please send it again in a minute"):
            readers.extract(b"plain words", name="a.txt", mime="text/plain")
        assert 0.9 < time.monotonic() - started < 3
        readers._slots.put(held)
        assert readers.extract(b"plain words", name="a.txt", mime="text/plain").text == "plain words"
    finally:
        readers.close()
    assert readers.pids() == []


def test_a_reader_process_taken_over_cannot_run_code_in_the_gateway_through_its_answer():
    """The gateway reads a reader's answer with an unpickler that knows only the result types: a
    child that a decoder exploit took over could otherwise send a pickle that runs code here."""
    import os
    import pickle

    from gateway.media.images import Rendition
    from gateway.media.isolated import _answer

    class Payload:
        def __reduce__(self):  # what a crafted answer would carry
            return (exec, ("import os; os.environ['GATEWAY_TEST_PWNED'] = '1'",))

    with pytest.raises(pickle.UnpicklingError, match=r"builtins\.exec"):
        _answer(pickle.dumps(("ok", Payload())))
    assert "GATEWAY_TEST_PWNED" not in os.environ
    rendition = Rendition(b"\xff\xd8", "image/jpeg", 1, 1)
    assert _answer(pickle.dumps(("ok", rendition))) == ("ok", rendition)
    with pytest.raises(pickle.UnpicklingError):
        _answer(pickle.dumps(["not", "a", "tuple", 1]))
