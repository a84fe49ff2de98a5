"""Which Bot API method carries an outbound file, and what Telegram refuses. Pure.

Telegram Bot API (https://core.telegram.org/bots/api#sendphoto, #senddocument, "Sending files"):
a photo is at most 10 MB, its width and height must not exceed 10,000 in total, and its aspect
ratio must be at most 20; bots send other files of up to 50 MB (2,000 MB through a local Bot API
server). A picture that breaks a photo rule is sent as a document instead (shown as a file, at full
quality), so only the document limit ever refuses a file.
"""

from __future__ import annotations

from gateway.core.files import MB, human_size
from gateway.core.types import OutboundAttachment

PHOTO_MAX_BYTES = 10 * MB
PHOTO_MAX_SIDES = 10_000
PHOTO_MAX_RATIO = 20
PHOTO_TYPES = frozenset({"image/jpeg", "image/png", "image/webp"})
"""Formats Telegram shows as a photo (a GIF goes as a document and plays as an animation)."""
DOCUMENT_MAX_BYTES = 50 * MB
LOCAL_SERVER_MAX_BYTES = 2000 * MB
CAPTION_LIMIT = 1024
"""Media captions: 0-1024 characters after entity parsing (UTF-16 units)."""


def as_photo(attachment: OutboundAttachment) -> bool:
    """Whether ``attachment`` goes out with ``sendPhoto`` (else ``sendDocument``)."""
    width, height = attachment.width, attachment.height
    if attachment.kind != "image" or attachment.mime_type not in PHOTO_TYPES or not width or not height:
        return False
    return (attachment.size <= PHOTO_MAX_BYTES and width + height <= PHOTO_MAX_SIDES
            and max(width, height) / min(width, height) <= PHOTO_MAX_RATIO)


def attachment_problem(attachment: OutboundAttachment, max_bytes: int = DOCUMENT_MAX_BYTES) -> str | None:
    """``None`` when Telegram takes the file (as a photo or a document), else why not."""
    if attachment.size <= 0:
        return f"{attachment.name} is empty; Telegram does not send empty files."
    if attachment.size > max_bytes:
        return (f"Telegram bots can send files up to {human_size(max_bytes)} (Bot API sendDocument); "
                f"{attachment.name} is {human_size(attachment.size)}.")
    return None
