"""Real files made in the test, for the document and audio readers: nothing is checked in.

``pdf(pages)`` writes a minimal PDF by hand (Helvetica text, a correct cross-reference table) that
pypdf and any viewer read; ``encrypted_pdf`` and ``owner_only_pdf`` encrypt it with pypdf;
``docx`` and ``xlsx`` use python-docx and openpyxl; ``ogg_opus`` builds the first two pages of an
Ogg Opus stream (``OpusHead``, ``OpusTags``, with Ogg CRCs) as Telegram's voice notes start;
``wav`` a second of silence with the standard library.
"""

from __future__ import annotations

import io
import struct
import wave
import zipfile


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def pdf(pages: list[str]) -> bytes:
    """A PDF with one page per string (each line of a string drawn as a text line)."""
    objects: list[bytes] = []
    page_ids = [4 + 2 * i for i in range(len(pages))]
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(b"<< /Type /Pages /Kids [" + b" ".join(b"%d 0 R" % i for i in page_ids)
                   + b"] /Count %d >>" % len(pages))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for index, text in enumerate(pages):
        lines = text.split("\n")
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 760 Td"]
        for line in lines:
            ops += [f"({_escape(line)}) Tj", "T*"]
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1")
        objects.append(b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                       b"/Contents %d 0 R >>" % (page_ids[index] + 1))
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def _encrypt(data: bytes, user: str, owner: str, algorithm: str) -> bytes:
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=user, owner_password=owner, algorithm=algorithm)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def encrypted_pdf(pages: list[str], password: str = "s3cret") -> bytes:
    """``pdf(pages)`` that opens only with ``password`` (AES-256)."""
    return _encrypt(pdf(pages), password, password + "-owner", "AES-256")


def owner_only_pdf(pages: list[str]) -> bytes:
    """``pdf(pages)`` encrypted with an owner password only: it opens with the empty password
    (permissions-only encryption, common in the wild)."""
    return _encrypt(pdf(pages), "", "owner-only", "AES-128")


def docx(paragraphs: list[str], table: list[list[str]] | None = None, heading: str | None = None) -> bytes:
    """A Word document: an optional level-1 heading, the paragraphs, then an optional table."""
    import docx as python_docx

    document = python_docx.Document()
    if heading:
        document.add_heading(heading, level=1)
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    if table:
        grid = document.add_table(rows=len(table), cols=len(table[0]))
        for r, row in enumerate(table):
            for c, value in enumerate(row):
                grid.cell(r, c).text = value
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def xlsx(sheets: dict[str, list[list[object]]]) -> bytes:
    """A workbook with one sheet per entry (rows of values, the first row usually headers)."""
    import openpyxl

    workbook = openpyxl.Workbook()
    workbook.remove(workbook.active)
    for title, rows in sheets.items():
        sheet = workbook.create_sheet(title)
        for row in rows:
            sheet.append(row)
    out = io.BytesIO()
    workbook.save(out)
    return out.getvalue()


def zip_bomb_docx(unpacked_mb: int = 200) -> bytes:
    """A .docx-shaped zip whose ``word/document.xml`` declares ``unpacked_mb`` MB of zeros
    (deflated to a few hundred KB)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        with archive.open("word/document.xml", "w", force_zip64=True) as member:
            chunk = b"0" * (1024 * 1024)
            for _ in range(unpacked_mb):
                member.write(chunk)
    return out.getvalue()


_CRC_TABLE = []
for _i in range(256):
    _r = _i << 24
    for _ in range(8):
        _r = ((_r << 1) ^ 0x04C11DB7) if _r & 0x80000000 else _r << 1
    _CRC_TABLE.append(_r & 0xFFFFFFFF)


def _ogg_crc(data: bytes) -> int:
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC_TABLE[((crc >> 24) & 0xFF) ^ byte]
    return crc


def _ogg_page(packet: bytes, sequence: int, header_type: int, granule: int = 0) -> bytes:
    segments = [255] * (len(packet) // 255) + [len(packet) % 255]
    header = (b"OggS" + bytes([0, header_type]) + struct.pack("<qIII", granule, 0x5EED, sequence, 0)
              + bytes([len(segments), *segments]))
    page = header + packet
    crc = _ogg_crc(page)
    return page[:22] + struct.pack("<I", crc) + page[26:]


def ogg_opus(payload: bytes = b"", seconds: float = 1.0) -> bytes:
    """The start of an Ogg Opus stream (what a Telegram voice note is): ``OpusHead`` and
    ``OpusTags`` pages, then ``payload`` as one more page (stand-in audio packets) ending at
    ``seconds`` (its granule position, in 48 kHz samples: what the stream lasts)."""
    head = b"OpusHead" + bytes([1, 1]) + struct.pack("<HIhB", 312, 48000, 0, 0)
    tags = b"OpusTags" + struct.pack("<I", 8) + b"Telegram" + struct.pack("<I", 0)
    pages = _ogg_page(head, 0, 0x02) + _ogg_page(tags, 1, 0x00)
    if payload:
        pages += _ogg_page(payload, 2, 0x04, granule=int(seconds * 48000))
    return pages


def wav(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """``seconds`` of 16-bit mono silence as a WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(rate)
        writer.writeframes(b"\x00\x00" * int(seconds * rate))
    return out.getvalue()
