"""The agent's ``send_file`` tool: a file from the session's workspace goes to the chat with the reply.

Rules, in the order they are checked (each refusal is a tool result the model can tell the user):

1. There is a chat to send to: the message being answered (``CURRENT_MESSAGE``) or the scheduled
   report's target (``REPLY_TARGET``), on a platform whose adapter sends files.
2. The path is inside the session's workspace (``agent.workspace``: symlinks resolved as the kernel
   would, then opened component by component without following any), and is a regular file.
3. It is not empty, at most ``MAX_SEND_BYTES``, and within the target platform's limit
   (``FileSendingAdapter.attachment_problem``: Telegram 50 MB, Feishu 30 MB, ...).
4. At most ``MAX_FILES_PER_REPLY`` files per reply.

Then the bytes go into the blob store and the call is recorded (``gateway.delivery.files``); the
turn's reply carries the file. Pictures (PNG, JPEG, WebP, GIF read by Pillow) are sent as images,
with their pixel size (Telegram's photo rules need it); everything else as a document.
"""

from __future__ import annotations

import dataclasses
import io
import mimetypes
import os
import stat
import warnings
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Annotated

from PIL import Image, UnidentifiedImageError
from pydantic import Field

from agent.context import RunContext
from agent.tools import Tool, tool
from agent.workspace import Workspace, WorkspaceError
from gateway.core.files import MB, human_size
from gateway.core.ports import Adapter, BlobStore, can_send_files
from gateway.core.types import CURRENT_MESSAGE, ChatAddress, OutboundAttachment
from gateway.delivery.files import REPLY_TARGET, OutboxFiles

NAME = "send_file"
MAX_SEND_BYTES = 100 * MB
"""The gateway's own limit for one file the agent sends (the platform's limit applies too)."""
MAX_FILES_PER_REPLY = 10
MAX_CAPTION_CHARS = 2000
IMAGE_FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}
"""Pillow formats sent as images, and their MIME types (the bytes decide, not the file name)."""
_CONTROL = {c: None for c in range(32)} | {127: None}


def reply_target() -> ChatAddress | None:
    """The chat the running turn answers into: a scheduled report's target, else the chat of the
    message being answered; ``None`` outside both."""
    target = REPLY_TARGET.get()
    if target is not None:
        return target
    message = CURRENT_MESSAGE.get()
    return message.address if message is not None else None


def describe(path: str, data: bytes, caption: str) -> OutboundAttachment:
    """The attachment for ``data`` read from ``path``: an ``image`` with its pixel size when Pillow
    reads a PNG, JPEG, WebP or GIF header, else a ``document`` typed by its extension (a file named
    ``.png`` that is no picture is ``application/octet-stream``)."""
    name = _display_name(path)
    guessed = mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a decompression-bomb warning: only the header is read
            with Image.open(io.BytesIO(data)) as image:
                mime, size = IMAGE_FORMATS.get(image.format or ""), image.size
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError):
        mime = None
    if mime is not None:
        return OutboundAttachment(kind="image", name=name, mime_type=mime, size=len(data), sha256="",
                                  caption=caption, width=int(size[0]), height=int(size[1]))
    if guessed in IMAGE_FORMATS.values():
        guessed = "application/octet-stream"  # named like a picture, but it is not one
    return OutboundAttachment(kind="document", name=name, mime_type=guessed, size=len(data), sha256="",
                              caption=caption)


def _display_name(path: str) -> str:
    """The file name the user sees: the last path component, control characters removed, at most
    255 characters (the extension kept)."""
    name = PurePosixPath(path.replace("\\", "/")).name.translate(_CONTROL).strip() or "file"
    if len(name) > 255:
        stem, ext = os.path.splitext(name)
        name = stem[: 255 - len(ext[:20])] + ext[:20]
    return name


def send_file_tool(*, workspace: Workspace, blobs: BlobStore, files: OutboxFiles,
                   adapters: Callable[[], Mapping[str, Adapter]]) -> Tool:
    """Builds the tool. ``adapters()`` returns the gateway's adapters by platform (asked per call,
    for the target platform's limits)."""

    def send_file(ctx: RunContext, path: str,
                  caption: Annotated[str, Field(max_length=MAX_CAPTION_CHARS)] = "") -> str:
        """Send a file from your workspace to the user: it is delivered right after your answer, in
        this chat (a scheduled report: with the report). Pictures (PNG, JPEG, WebP, GIF) are shown as
        images, other files as documents. Use it for charts, reports, exports you made (for example
        with run_shell or write_file); write the file first, then call this, then answer as usual and
        mention the file. Do not paste the file's contents into your answer.

        Args:
            path: the file's path relative to your workspace folder, e.g. "chart.png" or "out/report.csv".
            caption: short text shown with the file (optional).
        """
        target = reply_target()
        if target is None or not ctx.session_id:
            return "Error: send_file works only while answering a chat or running a scheduled report."
        adapter = adapters().get(target.platform)
        if adapter is None or not can_send_files(adapter):
            return f"Error: files cannot be sent to {target.platform} chats from this gateway. Nothing was sent."
        call_id = ctx.call_id or "call"
        done = files.recorded(ctx.session_id, ctx.turn_id, call_id)
        if done is not None:  # this call ran before a crash: its file (the bytes it read then) goes
            return _queued(done, target)
        if files.count(ctx.session_id, ctx.turn_id) >= MAX_FILES_PER_REPLY:
            return f"Error: at most {MAX_FILES_PER_REPLY} files go with one reply. {_display_name(path)} was not sent."
        try:
            fd = workspace.open_inside(ctx.session_id, path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO never blocks
        except WorkspaceError as exc:
            return f"Error: {exc}. Nothing was sent."
        except FileNotFoundError:
            return f"Error: {path} does not exist in your workspace (list_files shows what is there). Nothing was sent."
        except (IsADirectoryError, NotADirectoryError):
            return f"Error: {path} is a folder, not a file. Nothing was sent."
        with open(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                return f"Error: {path} is not a regular file. Nothing was sent."
            if info.st_size > MAX_SEND_BYTES:
                return (f"Error: {_display_name(path)} is {human_size(info.st_size)}; this gateway sends files up "
                        f"to {human_size(MAX_SEND_BYTES)}. Nothing was sent; tell the user, or make the file "
                        "smaller (compress or split it).")
            data = handle.read(MAX_SEND_BYTES + 1)
        if len(data) > MAX_SEND_BYTES:
            return (f"Error: {_display_name(path)} grew past {human_size(MAX_SEND_BYTES)} while it was read; "
                    "nothing was sent.")
        attachment = describe(path, data, caption.strip())
        if not data:
            return f"Error: {attachment.name} is empty; nothing was sent."
        problem = adapter.attachment_problem(attachment)  # type: ignore[attr-defined]
        if problem is not None:
            return (f"Error: {problem} Nothing was sent; tell the user, or make the file smaller "
                    "(compress or split it).")
        ref = blobs.put(data, attachment.mime_type)
        stored, _ = files.record(ctx.session_id, ctx.turn_id, call_id, dataclasses.replace(attachment,
                                                                                             sha256=ref.sha256))
        return _queued(stored, target)

    return tool(send_file, name=NAME, takes_context=True, side_effect="read", idempotent=True)


def _queued(attachment: OutboundAttachment, target: ChatAddress) -> str:
    what = f"{attachment.mime_type} image, {attachment.width}×{attachment.height}" \
        if attachment.kind == "image" else attachment.mime_type
    return (f"{attachment.name} ({what}, {human_size(attachment.size)}) will be sent to this {target.platform} chat "
            "right after your answer. Mention it in your answer if useful; do not paste its contents.")
