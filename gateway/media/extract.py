"""Document text for the model: plain text, Markdown, CSV, JSON, code, HTML, PDF, DOCX, XLSX.

Pure functions on bytes, no I/O: ``extract(data, name=, mime=, max_tokens=)`` returns an
``Extracted`` and never raises for bad input (an encrypted PDF, a corrupt or truncated file, a zip
bomb, a type it cannot read each become a result with ``ok=False`` and a ``problem`` sentence for
the user). Text is capped by estimated tokens (``agent.tokens``: UTF-8 bytes / 4), cut at a line
or page boundary, and ``cut`` says what was left out.

Which reader is used is decided by the bytes first (``%PDF-``, a zip holding ``word/document.xml``
or ``xl/workbook.xml``, an OLE container), then by MIME type and file extension, then by whether
the bytes decode as text (charset-normalizer for anything that is not UTF-8). Libraries: pypdf,
python-docx, openpyxl, charset-normalizer; HTML goes through ``agent.web.readable_text`` (the
same reader as ``web_fetch``).
"""

from __future__ import annotations

import codecs
import io
import logging
import posixpath
import re
import unicodedata
import warnings
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any

from agent.tokens import BYTES_PER_TOKEN, text_tokens
from agent.web import readable_text

log = logging.getLogger("gateway.media.extract")

MAX_UNCOMPRESSED_BYTES = 100 * 1024 * 1024
"""A DOCX/XLSX (a zip) whose members add up to more than this when unpacked is not opened."""
MAX_ZIP_MEMBERS = 10_000
MAX_SHEETS = 3
"""XLSX: the first sheets shown as tables (the others are named in ``cut``)."""
MAX_SHEET_ROWS = 500
MAX_SHEET_COLUMNS = 50
DETECT_BYTES = 64 * 1024
"""Bytes charset detection looks at (it samples within them)."""

TEXT_EXTENSIONS = {
    "txt": "text", "text": "text", "log": "text", "md": "markdown", "markdown": "markdown", "rst": "text",
    "csv": "csv", "tsv": "csv", "json": "json", "jsonl": "json", "ndjson": "json", "xml": "code",
    "yaml": "code", "yml": "code", "toml": "code", "ini": "code", "cfg": "code", "conf": "code", "env": "code",
    "py": "code", "js": "code", "mjs": "code", "ts": "code", "tsx": "code", "jsx": "code", "java": "code",
    "kt": "code", "go": "code", "rs": "code", "c": "code", "h": "code", "cc": "code", "cpp": "code",
    "hpp": "code", "cs": "code", "rb": "code", "php": "code", "swift": "code", "scala": "code", "sh": "code",
    "bash": "code", "zsh": "code", "ps1": "code", "sql": "code", "r": "code", "lua": "code", "pl": "code",
    "css": "code", "scss": "code", "vue": "code", "svelte": "code", "tex": "code", "dockerfile": "code",
    "makefile": "code", "diff": "code", "patch": "code", "srt": "text", "vtt": "text", "ics": "text",
}
HTML_EXTENSIONS = {"html", "htm", "xhtml"}
TEXT_MIMES = {
    "application/json": "json", "application/ld+json": "json", "application/x-ndjson": "json",
    "application/xml": "code", "application/x-yaml": "code", "application/yaml": "code",
    "application/toml": "code", "application/javascript": "code", "application/x-javascript": "code",
    "application/x-sh": "code", "application/x-python": "code", "application/sql": "code",
    "application/x-tex": "code", "text/markdown": "markdown", "text/x-markdown": "markdown",
    "text/csv": "csv", "text/tab-separated-values": "csv",
}
FORMAT_NAMES = {
    "text": "text", "markdown": "Markdown", "csv": "CSV", "json": "JSON", "code": "code", "html": "HTML",
    "pdf": "PDF", "docx": "Word document", "xlsx": "Excel workbook",
}
_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # Compound File: .doc/.xls, and every password-protected DOCX/XLSX
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


@dataclass(frozen=True, slots=True)
class Extracted:
    """What a document holds for the model.

    Attributes:
        format: ``text`` | ``markdown`` | ``csv`` | ``json`` | ``code`` | ``html`` | ``pdf`` |
            ``docx`` | ``xlsx`` | ``other`` (a type this module does not read).
        ok: text was read (possibly empty for an empty file); ``False``: see ``problem``.
        text: the text, at most ``max_tokens`` (estimated); ``""`` when not ``ok``.
        detail: facts worth showing with it (``"12 pages"``, ``"2 sheets"``, ``"windows-1252"``), or ``""``.
        cut: what was left out (``"pages 9-40 (about 21,000 tokens)"``), or ``""`` when nothing was.
        problem: why nothing was read, as a clause that completes "I could not use "x.pdf": …"
            for the user and the model (encrypted, corrupt, too large unpacked, no text layer),
            or ``""``; empty for ``other`` too (an unreadable type is not a problem: its name,
            type and size are shown).
    """

    format: str
    ok: bool
    text: str = ""
    detail: str = ""
    cut: str = ""
    problem: str = ""

    @property
    def format_name(self) -> str:
        """``"PDF"``, ``"Word document"``, ... for notes (``other``: ``"file"``)."""
        return FORMAT_NAMES.get(self.format, "file")


def extension(name: str | None) -> str:
    """Lower-case extension of ``name`` without the dot (``"Report.PDF"`` -> ``"pdf"``); a bare
    ``Makefile`` or ``Dockerfile`` counts as its own extension; ``""`` when none."""
    if not name:
        return ""
    base = posixpath.basename(name.replace("\\", "/")).lower()
    if base in ("makefile", "dockerfile"):
        return base
    return base.rsplit(".", 1)[1] if "." in base.strip(".") else ""


def display_name(name: str | None, limit: int = 120) -> str:
    """A file name as data for a note: control and format characters (bidi overrides, zero
    width) removed, whitespace collapsed, cut to ``limit`` characters, in double quotes with
    ``"`` and ``\\`` escaped (``'x" ignore all'`` -> ``"x\\" ignore all"``). ``"(no name)"``
    when empty."""
    cleaned = "".join(" " if unicodedata.category(ch) in ("Zl", "Zp") or ch in "\t\r\n" else ch
                      for ch in (name or "") if unicodedata.category(ch) not in ("Cc", "Cf", "Cs", "Co", "Cn")
                      or ch in "\t\r\n")
    cleaned = " ".join(cleaned.split())
    if not cleaned:
        return "(no name)"
    if len(cleaned) > limit:
        cleaned = cleaned[: limit - 1] + "…"
    return '"' + cleaned.replace("\\", "\\\\").replace('"', '\\"') + '"'


def sniff(data: bytes, name: str | None = None, mime: str | None = None) -> str:
    """The reader for these bytes: one of ``Extracted.format``'s values (``other`` when none fits).

    The bytes win over the name and MIME type (a PDF called ``notes.txt`` is read as a PDF);
    a zip or OLE file that is not a DOCX/XLSX is ``other``, except that an OLE file named
    ``.docx``/``.xlsx`` is kept as such so the reader can say it is password-protected.
    """
    ext = extension(name)
    mime = (mime or "").split(";", 1)[0].strip().lower()
    named_pdf = ext == "pdf" or mime == "application/pdf"
    if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"%PDF-") or (named_pdf and b"%PDF-" in data[:1024]):
        return "pdf"  # PDF 1.7 7.5.2: the header may follow other bytes within the first 1024
    if data.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                names = set(archive.namelist())
        except (zipfile.BadZipFile, ValueError, OSError):
            return ext if ext in ("docx", "xlsx") else "other"
        if "word/document.xml" in names:
            return "docx"
        if "xl/workbook.xml" in names:
            return "xlsx"
        return "other"
    if data.startswith(_OLE):
        return ext if ext in ("docx", "xlsx") else "other"
    if named_pdf:
        return "pdf"  # named a PDF but without the header: the reader says it is damaged
    if ext in ("docx", "xlsx"):
        return ext
    if ext in HTML_EXTENSIONS or mime in ("text/html", "application/xhtml+xml"):
        return "html"
    if b"\x00" in data[:8192] and not data.startswith(tuple(bom for bom, _ in _BOMS)):
        return "other"  # NUL bytes: binary (UTF-16/32 text carries a BOM)
    known = TEXT_EXTENSIONS.get(ext) or TEXT_MIMES.get(mime) or ("text" if mime.startswith("text/") else None)
    if re.match(rb"\s*(<!doctype html|<html)", data[:512], re.IGNORECASE) and known in (None, "text"):
        return "html"
    if known:
        return known
    return "text" if _looks_like_text(data) else "other"


def decode_text(data: bytes) -> tuple[str, str] | None:
    """``(text, encoding)`` of bytes that are text, or ``None`` when they are not.

    A byte order mark decides; otherwise strict UTF-8; otherwise charset-normalizer's best guess
    over the first ``DETECT_BYTES`` (``cp1252``, ``cp1251``, ``cp932``, ``gb18030``...; ``cp1252``
    when it ties with the best), applied to the whole text with undecodable bytes replaced.
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data.decode(encoding, errors="replace"), encoding.removesuffix("-sig")
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as exc:
        if exc.reason == "unexpected end of data":  # UTF-8 whose last character was cut off
            return data.decode("utf-8", errors="replace"), "utf-8"
    import charset_normalizer

    matches = charset_normalizer.from_bytes(data[:DETECT_BYTES])
    best = matches.best()
    if best is None:
        return None
    encoding = best.encoding
    tied = [m.encoding for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence)]
    if encoding != "cp1252" and "cp1252" in tied:
        encoding = "cp1252"  # the commonest 8-bit encoding wins a tie (short Western text fits several)
    return data.decode(encoding, errors="replace"), encoding


def _looks_like_text(data: bytes) -> bool:
    if not data:
        return True
    decoded = decode_text(data[:DETECT_BYTES])
    if decoded is None:
        return False
    text = decoded[0]
    controls = len(_CONTROL.findall(text)) + text.count("\ufffd")
    return controls <= max(2, len(text) // 100)


# ------------------------------------------------------------------------------------- capping


def _kb(tokens: int) -> str:
    return f"about {tokens:,} tokens"


def cap_text(text: str, max_tokens: int) -> tuple[str, int]:
    """``text`` cut to at most ``max_tokens`` estimated tokens, at the last line break in the
    final fifth when there is one; returns ``(kept, estimated tokens left out)``."""
    if text_tokens(text) <= max_tokens:
        return text, 0
    limit = max_tokens * BYTES_PER_TOKEN
    kept = text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")
    newline = kept.rfind("\n")
    if newline >= len(kept) * 4 // 5:
        kept = kept[:newline]
    return kept, text_tokens(text) - text_tokens(kept)


def _cap_parts(parts: Iterable[tuple[str, str]], max_tokens: int, unit: str, total: int) -> tuple[str, str]:
    """Joins ``(label, text)`` parts (pages, sheets) of ``total`` until ``max_tokens``; the part that
    does not fit whole is cut, and no later part is read. Returns ``(text, cut)``, ``cut`` naming
    the parts left out (``"the rest of page 9 and pages 10-40 of 40"``) or ``""``."""
    out: list[str] = []
    used = 0
    for index, (label, body) in enumerate(parts, 1):
        block = f"{label}\n{body.strip()}" if label else body.strip()
        size = text_tokens(block) + 1
        if used + size <= max_tokens:
            out.append(block)
            used += size
            continue
        later = (f"{unit}s {index + 1}-{total}" if total > index + 1 else f"{unit} {total}") if total > index else ""
        room = max_tokens - used
        if room > 50:  # a useful piece of the part that does not fit
            out.append(cap_text(block, room)[0])
            what = f"the rest of {unit} {index}" + (f" and {later}" if later else "")
        else:
            what = f"{unit}s {index}-{total}" if total > index else f"{unit} {index}"
        return "\n\n".join(out), f"{what} of {total}"
    return "\n\n".join(out), ""


# ------------------------------------------------------------------------------------ the readers


def extract(data: bytes, *, name: str | None = None, mime: str | None = None, max_tokens: int = 8000) -> Extracted:
    """The text of a document for the model, at most ``max_tokens`` estimated tokens.

    Args:
        data: the file's bytes.
        name: its file name as the platform gave it (only its extension is used here).
        mime: its MIME type as the platform gave it.
        max_tokens: cap of ``Extracted.text`` (estimated as UTF-8 bytes / 4).

    Never raises for bad input: every reader's failure becomes ``ok=False`` with a ``problem``.
    """
    fmt = sniff(data, name, mime)
    try:
        if fmt == "pdf":
            return _pdf(data, max_tokens)
        if fmt == "docx":
            return _docx(data, max_tokens)
        if fmt == "xlsx":
            return _xlsx(data, max_tokens)
        if fmt == "other":
            return Extracted("other", False)
        return _text(data, fmt, max_tokens)
    except Exception as exc:  # a reader's bug or an input it chokes on: one note, never a crash
        log.warning("could not read a %s document (%d bytes): %s: %s", fmt, len(data), type(exc).__name__, exc)
        return Extracted(fmt, False, problem="it seems damaged or incomplete")


def _text(data: bytes, fmt: str, max_tokens: int) -> Extracted:
    decoded = decode_text(data)
    if decoded is None:
        return Extracted(fmt, False, problem="it is not text in any encoding that could be recognised")
    text, encoding = decoded
    title = ""
    if fmt == "html":
        title, text = readable_text(text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    kept, left = cap_text(text, max_tokens)
    detail = ", ".join(x for x in (f"title {display_name(title)}" if title else "",
                                   encoding if encoding not in ("utf-8", "ascii") else "") if x)
    cut = f"the end of the file ({_kb(left)}; {text_tokens(text):,} in all)" if left else ""
    return Extracted(fmt, True, kept, detail, cut)


def _pdf(data: bytes, max_tokens: int) -> Extracted:
    from pypdf import PasswordType, PdfReader
    from pypdf.errors import DependencyError, PdfReadError

    if b"%PDF-" not in data[:1024]:
        return Extracted("pdf", False, problem="it has no PDF header (damaged, or not a PDF)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            reader = PdfReader(io.BytesIO(data), strict=False)
        except (PdfReadError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            log.info("unreadable PDF (%d bytes): %s", len(data), exc)
            return Extracted("pdf", False, problem="it seems damaged or incomplete")
        if reader.is_encrypted:
            try:  # permissions-only encryption opens with the empty password
                opened = reader.decrypt("")
            except (DependencyError, NotImplementedError, PdfReadError) as exc:
                log.info("encrypted PDF not opened: %s", exc)
                opened = PasswordType.NOT_DECRYPTED
            if opened == PasswordType.NOT_DECRYPTED:
                return Extracted("pdf", False, problem="the PDF is password-protected (encrypted), so its text cannot "
                                                       "be read; send a copy without a password")
        total = len(reader.pages)
        found_text = [False]

        def pages() -> Iterator[tuple[str, str]]:
            for number, page in enumerate(reader.pages, 1):
                try:
                    body = _CONTROL.sub("", page.extract_text() or "")
                    found_text[0] = found_text[0] or bool(re.search(r"\w", body))
                except Exception as exc:  # one bad page: say so, go on with the others
                    log.info("PDF page %d unreadable: %s", number, exc)
                    body = "(this page could not be read)"
                yield f"[page {number}]", body

        text, cut = _cap_parts(pages(), max_tokens, "page", total)
    detail = f"{total} page{'s' if total != 1 else ''}"
    if not found_text[0]:
        return Extracted("pdf", False, detail=detail,
                         problem="the PDF has no text layer (a scan, or only images), so its text cannot be read "
                                 "without OCR")
    return Extracted("pdf", True, text, detail, cut)


def _check_zip(data: bytes, what: str) -> str:
    """``""`` when the zip may be opened, else the problem (a zip bomb, too many members)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError):
        return "it seems damaged or incomplete"
    unpacked = sum(m.file_size for m in members)
    if len(members) > MAX_ZIP_MEMBERS or unpacked > MAX_UNCOMPRESSED_BYTES:
        return (f"the {what} was not opened: it would unpack to {unpacked / 1e6:,.0f} MB in {len(members):,} parts, "
                f"more than the {MAX_UNCOMPRESSED_BYTES // (1024 * 1024)} MB allowed")
    return ""


def _office_problem(data: bytes, fmt: str) -> str:
    what = FORMAT_NAMES[fmt]
    if data.startswith(_OLE):
        return (f"the {what} is password-protected (encrypted) or in the old .doc/.xls format, so its text cannot "
                "be read; send a copy without a password, saved as .docx/.xlsx")
    if not data.startswith(b"PK"):
        return f"it is not a valid .{fmt} file (damaged, or another format)"
    return _check_zip(data, what)


def _docx(data: bytes, max_tokens: int) -> Extracted:
    if problem := _office_problem(data, "docx"):
        return Extracted("docx", False, problem=problem)
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    document = docx.Document(io.BytesIO(data))
    lines: list[str] = []
    tables = 0
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            text = _CONTROL.sub("", block.text).strip()
            if not text:
                continue
            style = (block.style.name if block.style is not None else "") or ""
            level = re.match(r"Heading (\d)", style)
            if level:
                text = "#" * int(level.group(1)) + " " + text
            elif style == "Title":
                text = "# " + text
            elif style.startswith("List"):
                text = "- " + text
            lines.append(text)
        elif isinstance(block, Table):
            tables += 1
            rows = [[cell.text for cell in row.cells] for row in block.rows]
            lines.append(markdown_table(rows))
    text = "\n\n".join(lines)
    kept, left = cap_text(text, max_tokens)
    detail = f"{tables} table{'s' if tables != 1 else ''}" if tables else ""
    cut = f"the end of the document ({_kb(left)}; {text_tokens(text):,} in all)" if left else ""
    return Extracted("docx", True, kept, detail, cut)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        value = int(value)
    elif isinstance(value, datetime):
        value = value.isoformat(sep=" ", timespec="minutes") if value.time() != time(0) else value.date().isoformat()
    elif isinstance(value, date | time):
        value = value.isoformat()
    return " ".join(_CONTROL.sub("", str(value)).split()).replace("|", "\\|")


def markdown_table(rows: list[list[Any]]) -> str:
    """Rows of cells as a Markdown table, the first row as its header (cells cleaned: no line
    breaks, ``|`` escaped; rows padded to the widest)."""
    cells = [[_cell(v) for v in row] for row in rows]
    width = max((len(r) for r in cells), default=0)
    if not width:
        return ""
    cells = [r + [""] * (width - len(r)) for r in cells]
    lines = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * width]
    lines += ["| " + " | ".join(r) + " |" for r in cells[1:]]
    return "\n".join(lines)


def _xlsx(data: bytes, max_tokens: int) -> Extracted:
    if problem := _office_problem(data, "xlsx"):
        return Extracted("xlsx", False, problem=problem)
    import openpyxl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # openpyxl warns about styles and extensions it ignores
        workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    try:
        sheets = list(workbook.worksheets)
        parts: list[tuple[str, str]] = []
        notes: list[str] = []
        for sheet in sheets[:MAX_SHEETS]:
            rows: list[list[Any]] = []
            more_rows = False
            for row in sheet.iter_rows(values_only=True):
                if len(rows) >= MAX_SHEET_ROWS:
                    more_rows = True
                    break
                rows.append(list(row[:MAX_SHEET_COLUMNS]))
            while rows and all(v is None or v == "" for v in rows[-1]):
                rows.pop()
            width = max((max((i + 1 for i, v in enumerate(r) if v not in (None, "")), default=0) for r in rows),
                        default=0)
            rows = [r[:width] for r in rows]
            label = f"[sheet {display_name(sheet.title)}]"
            if more_rows:
                notes.append(f"rows after {MAX_SHEET_ROWS} of sheet {display_name(sheet.title)}")
            parts.append((label, markdown_table(rows) if rows else "(empty sheet)"))
        if len(sheets) > MAX_SHEETS:
            notes.append("sheets " + ", ".join(display_name(s.title) for s in sheets[MAX_SHEETS:]))
    finally:
        workbook.close()
    text, cut = _cap_parts(parts, max_tokens, "sheet", min(len(sheets), MAX_SHEETS))
    cut = "; ".join(x for x in (cut, *notes) if x)
    detail = f"{len(sheets)} sheet{'s' if len(sheets) != 1 else ''}"
    return Extracted("xlsx", True, text, detail, cut)
