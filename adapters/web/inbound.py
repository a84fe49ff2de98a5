"""A browser's chat POST -> ``InboundMessage`` (pure). Platform ``web``; one chat per browser user.

Body (JSON): ``{"id": "<client message id>", "text": "...", "name": "<display name>", "files": [...]}``
(``files``: what ``POST /web/files`` answered for each upload, at most ``MAX_FILES``). The id is
made by the page once per message and sent again on a retry, so the inbox drops the repeat. The
inbox dedupes on (platform, tenant, message id) and the id comes from the browser, so the message
id is scoped by the web user: ``"<user id>:<client id>"`` (one browser cannot drop another's message
by reusing its id).
"""

from __future__ import annotations

import re
import time
from typing import Any

from gateway.core.types import Attachment, ChatAddress, InboundMessage, Sender

TENANT = "web"
MAX_TEXT_CHARS = 16_000
MAX_NAME_CHARS = 64
DEFAULT_NAME = "Web user"

MAX_FILES = 10
_MESSAGE_ID = re.compile(r"^[A-Za-z0-9_-]{8,64}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}")
"""A media type as ``POST /web/files`` answers it: ``type/subtype``, lower case, no parameters
(RFC 6838 §4.2: restricted names of at most 127 characters)."""
MAX_UPLOAD_BYTES = 1 << 40
"""Largest ``size`` a message's file may claim (the upload limit itself is ``media.upload_max_mb``,
checked when the file is read): a size past any real upload is refused as malformed."""
_COMMAND = re.compile(r"^/([A-Za-z][A-Za-z0-9_-]{0,31})(?:\s+|$)")


class WebInputError(ValueError):
    """The POST body cannot become a message; the text is safe to show to the user."""


def address_of(user_id: str) -> ChatAddress:
    """The web chat of browser user ``user_id`` (the chat id is the user id)."""
    return ChatAddress("web", TENANT, user_id)


def client_id_of(message_id: str) -> str:
    """The page's own id of a web message id ``"<user id>:<client id>"`` (unchanged without ``:``)."""
    return message_id.rpartition(":")[2]


def kind_of(mime: str) -> str:
    """The attachment kind of an upload of type ``mime``."""
    major = mime.split("/", 1)[0]
    if mime == "image/gif":
        return "animation"
    return major if major in ("image", "audio", "video") else "document"


def files_from_post(files: Any, user_id: str, check: Any) -> tuple[Attachment, ...]:
    """The uploads a message refers to; ``check(user_id, sha256, ticket)`` says whether the ticket
    is the one ``POST /web/files`` gave this user for that blob (nobody attaches another's file).

    Raises:
        WebInputError: not a list, too many, or an entry that is not a valid upload of this user.
    """
    if files is None:
        return ()
    if not isinstance(files, list) or len(files) > MAX_FILES:
        raise WebInputError(f"files must be a list of at most {MAX_FILES} uploads")
    found = []
    for entry in files:
        if not isinstance(entry, dict):
            raise WebInputError("each file must be an object from POST /web/files")
        sha, ticket, mime = entry.get("sha256"), entry.get("ticket"), entry.get("mime_type")
        name, size = entry.get("name"), entry.get("size")
        valid = isinstance(sha, str) and _SHA256.match(sha) and isinstance(ticket, str)
        if not (valid and check(user_id, sha, ticket)):
            raise WebInputError("a file is not one of your uploads: upload it again")
        if not (isinstance(mime, str) and MEDIA_TYPE.fullmatch(mime) and isinstance(size, int)
                and not isinstance(size, bool) and 0 < size <= MAX_UPLOAD_BYTES
                and (name is None or isinstance(name, str))):
            raise WebInputError("a file's mime_type, size or name is malformed")
        found.append(Attachment(kind_of(mime), str(sha), name, mime, size, sha256=str(sha)))
    return tuple(found)


def message_from_post(body: Any, user_id: str, now: float | None = None, check: Any = None,
                      language: str | None = None) -> InboundMessage:
    """Normalizes one chat POST of browser user ``user_id`` (from the signed cookie); ``language``
    is the page's ``Accept-Language`` header (the browser's languages, a hint for the gateway's texts).

    The message id is ``f"{user_id}:{body['id']}"``. A leading ``/name`` is a command
    (``/link ABC123`` -> command ``link``, text ``ABC123``), as the
    platforms' own command syntax is.

    Raises:
        WebInputError: not an object, no or bad ``id``, a ``text`` that is not a string, empty
            (no text and no files) or over ``MAX_TEXT_CHARS`` text, a ``name`` that is not a string.
    """
    if not isinstance(body, dict):
        raise WebInputError("the request body must be a JSON object")
    message_id, text, name = body.get("id"), body.get("text"), body.get("name", "")
    if not isinstance(message_id, str) or not _MESSAGE_ID.match(message_id):
        raise WebInputError("id must be 8-64 letters, digits, '-' or '_'")
    attachments = files_from_post(body.get("files"), user_id, check or (lambda *_: False))
    if text is not None and not isinstance(text, str):
        raise WebInputError(f"text must be a string, not {type(text).__name__}")
    if not text or (not text.strip() and not attachments):
        if not attachments:
            raise WebInputError("the message is empty")
        text = ""
    if len(text) > MAX_TEXT_CHARS:
        raise WebInputError(f"the message is too long ({len(text)} characters; at most {MAX_TEXT_CHARS})")
    if not isinstance(name, str):
        raise WebInputError("name must be a string")
    name = " ".join(name.split())[:MAX_NAME_CHARS] or DEFAULT_NAME
    text = text.strip()
    command = None
    if match := _COMMAND.match(text):
        command, text = match.group(1).lower(), text[match.end():].strip()
    return InboundMessage(
        address=address_of(user_id), message_id=f"{user_id}:{message_id}", chat_type="dm", sender=Sender(user_id, name),
        text=text, command=command, received_at=time.time() if now is None else now, attachments=attachments,
        language=language,
    )
