"""Images for the model: sniff what bytes are, decode, take the first frame, scale, re-encode.

``prepare_image(data, max_side, max_bytes) -> Rendition`` turns whatever a user sent (JPEG, PNG,
WebP, GIF, BMP, TIFF, an animated GIF/WebP/APNG: its first frame) into one image the model APIs
take: JPEG for photos, PNG for images with transparency (flattened to JPEG when PNG is too large),
the longest side at most ``max_side`` pixels, at most ``max_bytes`` bytes (JPEG quality steps
down, then the size, until it fits). EXIF orientation is applied, metadata is dropped. The
output is deterministic for the same input and Pillow version: a replayed turn sends the rendition
stored in the blob store, never a new encoding.

Formats the chat-completions APIs accept (OpenAI "Images and vision": PNG, JPEG, WEBP, non-animated
GIF, up to 20 MB per image); the default limits (2048 px, 3.5 MB) fit OpenAI, Anthropic (5 MB
base64) and Gemini-compatible endpoints.

Bad input raises ``gateway.core.errors.MediaError`` with a plain-words reason (never a crash):
not an image (an HTML sign-in page, a PDF), a format Pillow cannot read, truncated or corrupt
data, or a decompression bomb (more than ``MAX_PIXELS``).
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from gateway.core.errors import MediaError

MAX_PIXELS = 64_000_000
"""Images with more pixels are refused before decoding (a 100 KB PNG can claim 50,000 x 50,000)."""
JPEG_QUALITIES = (85, 75, 65, 50)

_MAGIC: tuple[tuple[bytes, int, str], ...] = (
    (b"\xff\xd8\xff", 0, "image/jpeg"),
    (b"\x89PNG\r\n\x1a\n", 0, "image/png"),
    (b"GIF87a", 0, "image/gif"),
    (b"GIF89a", 0, "image/gif"),
    (b"WEBP", 8, "image/webp"),
    (b"BM", 0, "image/bmp"),
    (b"II*\x00", 0, "image/tiff"),
    (b"MM\x00*", 0, "image/tiff"),
    (b"%PDF-", 0, "application/pdf"),
    (b"OggS", 0, "audio/ogg"),
    (b"PK\x03\x04", 0, "application/zip"),
    (b"\x1f\x8b", 0, "application/gzip"),
    (b"\x1aE\xdf\xa3", 0, "video/webm"),
    (b"ftyp", 4, "video/mp4"),
    (b"ID3", 0, "audio/mpeg"),
)


BMP_HEADER_SIZES = frozenset({12, 16, 40, 52, 56, 64, 108, 124})
"""The sizes a BMP's DIB header may have (little-endian ``uint32`` at byte 14: BITMAPCOREHEADER 12,
OS/2 16 and 64, BITMAPINFOHEADER 40, its V2/V3 52 and 56, V4 108, V5 124): with ``BM`` alone, a
CSV of BMI figures or a text beginning "BMW" was taken for a bitmap."""


def sniff(data: bytes) -> str | None:
    """The type the first bytes of ``data`` show (``image/jpeg``, ``text/html``, ...), or ``None``.

    Only magic numbers are read; a platform's declared type is a claim, this is what the bytes are.
    A BMP needs its DIB header's size too (``BMP_HEADER_SIZES``): ``BM`` begins many texts.
    """
    for magic, offset, mime in _MAGIC:
        if data[offset:offset + len(magic)] == magic and (mime != "image/webp" or data[:4] == b"RIFF") \
                and (mime != "image/bmp" or int.from_bytes(data[14:18], "little") in BMP_HEADER_SIZES):
            return mime
    head = data[:512].lstrip().lower()
    if head.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "text/html"
    return None


def is_image_type(mime: str | None) -> bool:
    return bool(mime) and str(mime).split(";")[0].strip().lower().startswith("image/")


@dataclass(frozen=True, slots=True)
class Rendition:
    """An image as it goes to the model: ``data`` (``mime_type``), ``width`` x ``height`` pixels."""

    data: bytes
    mime_type: str
    width: int
    height: int


MAX_JPEG_SCANS = 100
"""Most scans (SOS markers, ``FF DA``) a JPEG may have: progressive encoders write about ten; the
marker cannot occur inside the compressed data (``FF`` is followed by ``00`` there)."""


def prepare_image(data: bytes, max_side: int = 2048, max_bytes: int = 3_500_000) -> Rendition:
    """The model's rendition of ``data`` (see the module doc).

    Raises:
        MediaError: not an image, unreadable, corrupt, or too many pixels.
    """
    found = sniff(data)
    if found is not None and not found.startswith("image/"):
        what = "a web page" if found == "text/html" else found
        raise MediaError(f"it is not an image (the file is {what})")
    if data.startswith(b"\xff\xd8") and (scans := data.count(b"\xff\xda")) > MAX_JPEG_SCANS:
        # libjpeg decodes every scan of a progressive JPEG: 1,000 repeated scans cost a minute of CPU
        raise MediaError(f"the image is built of {scans} scans (a normal photo has at most a few dozen)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            if image.width * image.height > MAX_PIXELS:
                raise MediaError(f"the image is too large to open ({image.width} x {image.height} pixels)")
            image.seek(0)  # the first frame of an animation
            image.load()
            frame = ImageOps.exif_transpose(image) or image
    except MediaError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise MediaError("it could not be read as an image (an unsupported format or not an image)") from exc
    except (OSError, ValueError, SyntaxError, EOFError) as exc:  # truncated or corrupt data
        raise MediaError("the image is damaged or incomplete and could not be read") from exc
    return _encode(frame, max_side, max_bytes)


def _has_alpha(image: Image.Image) -> bool:
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        low = image.convert("RGBA").getchannel("A").getextrema()[0]
        return isinstance(low, int | float) and low < 255
    return False


def _scaled(image: Image.Image, side: int) -> Image.Image:
    if max(image.size) <= side:
        return image
    scale = side / max(image.size)
    return image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                        Image.Resampling.LANCZOS)


def _encode(image: Image.Image, max_side: int, max_bytes: int) -> Rendition:
    side = max_side
    while True:
        scaled = _scaled(image, side)
        if _has_alpha(scaled):
            out = io.BytesIO()
            scaled.convert("RGBA").save(out, "PNG", optimize=True)
            if out.tell() <= max_bytes:
                return Rendition(out.getvalue(), "image/png", scaled.width, scaled.height)
            flat = Image.new("RGB", scaled.size, (255, 255, 255))
            flat.paste(scaled.convert("RGBA"), mask=scaled.convert("RGBA").getchannel("A"))
            scaled = flat
        rgb = scaled.convert("RGB")
        for quality in JPEG_QUALITIES:
            out = io.BytesIO()
            rgb.save(out, "JPEG", quality=quality, optimize=True)
            if out.tell() <= max_bytes:
                return Rendition(out.getvalue(), "image/jpeg", rgb.width, rgb.height)
        if side <= 256:
            raise MediaError("the image could not be made small enough for the model")
        side = int(side * 0.75)


def thumbnail(data: bytes, side: int = 256) -> Rendition:
    """A small preview of an image (admin transcript): the longest side ``side`` pixels, JPEG (PNG
    with transparency). Raises ``MediaError`` like ``prepare_image``."""
    return prepare_image(data, side, 200_000)
