"""How an outbound file goes to Feishu, and what Feishu refuses. Pure.

Feishu open API im/v1: ``POST /open-apis/im/v1/images`` (``image_type=message``; JPG, JPEG, PNG,
WEBP, GIF, BMP, ICO, TIFF, HEIC; at most 10 MB, not empty; GIF at most 2000 x 2000 pixels, others
12000 x 12000) returns an ``image_key`` for an ``image`` message; ``POST /open-apis/im/v1/files``
(``file_type`` opus, mp4, pdf, doc, xls, ppt or stream; at most 30 MB, not empty) returns a
``file_key`` for a ``file`` message. A picture the image API would refuse goes through the file API
(shown as a file), so only the file limit ever refuses a file.
"""

from __future__ import annotations

import os

from gateway.core.files import MB, human_size
from gateway.core.types import OutboundAttachment

IMAGE_MAX_BYTES = 10 * MB
IMAGE_MAX_SIDE = 12_000
GIF_MAX_SIDE = 2_000
IMAGE_TYPES = frozenset({"image/jpeg", "image/png", "image/webp", "image/gif", "image/bmp", "image/x-icon",
                         "image/vnd.microsoft.icon", "image/tiff", "image/heic"})
FILE_MAX_BYTES = 30 * MB
_FILE_TYPES = {".opus": "opus", ".mp4": "mp4", ".pdf": "pdf", ".doc": "doc", ".docx": "doc", ".xls": "xls",
               ".xlsx": "xls", ".ppt": "ppt", ".pptx": "ppt"}


def as_image(attachment: OutboundAttachment) -> bool:
    """Whether ``attachment`` goes through the image API (else the file API)."""
    width, height = attachment.width or 0, attachment.height or 0
    side = GIF_MAX_SIDE if attachment.mime_type == "image/gif" else IMAGE_MAX_SIDE
    return (attachment.kind == "image" and attachment.mime_type in IMAGE_TYPES and 0 < attachment.size
            <= IMAGE_MAX_BYTES and 0 < width <= side and 0 < height <= side)


def file_type(attachment: OutboundAttachment) -> str:
    """The file API's ``file_type`` for the file's extension (``stream`` for anything else)."""
    return _FILE_TYPES.get(os.path.splitext(attachment.name)[1].lower(), "stream")


def attachment_problem(attachment: OutboundAttachment) -> str | None:
    """``None`` when Feishu takes the file (as an image or a file), else why not."""
    if attachment.size <= 0:
        return f"{attachment.name} is empty; Feishu does not take empty files."
    if attachment.size > FILE_MAX_BYTES and not as_image(attachment):
        return (f"Feishu takes files up to {human_size(FILE_MAX_BYTES)} (open API im/v1/files); "
                f"{attachment.name} is {human_size(attachment.size)}.")
    return None
