"""The media pipeline of a turn: take a message's files in, and give the model what it can use.

``MediaService.take_in(message, ...) -> Intake`` runs on the turn's worker thread before the
user message is written to the transcript. For each attachment:

1. **Limits first.** The gateway's own cap for the kind (``media.max_mb``) and the platform's
   (``MediaAdapter.download_limit``: Telegram's cloud Bot API serves at most 20 MB) are checked
   against the size the platform declared, before anything is downloaded.
2. **Download once**, through the adapter (``MediaAdapter.download``, run on the main loop with
   the platform's rules: Telegram ``getFile``, Slack ``url_private_download`` with the bot token,
   Feishu message resources), or read from the blob store (a web chat upload).
3. **Check the bytes** (``images.sniff``): an image whose bytes are a web page (Slack's sign-in
   page), a PDF, or nothing Pillow can read is never passed on as an image.
4. **Store** the original as a blob and, for pictures (image, sticker, animation; a video's or
   animation's thumbnail), the model's rendition (``images.prepare_image``), each recorded in
   ``attachments`` with the session and the sender.
5. Voice, audio and documents are read (``ContentReader``); each transcription's cost comes back
   in ``Intake.spend`` for the turn to record with the user message (a ``usage`` row, written once).
6. The transcript keeps one ``MediaRef`` per file (``messages.meta["attachments"]``): sha256, kind,
   MIME type, size, cleaned name, the rendition's reference, or a ``note`` saying why it could not
   be used. ``Intake.notes`` are the plain-words lines the user is told ("⚠️ I could not use
   "big.zip": too big (30.0 MB); Telegram bots can take files up to 20 MB.").

Failures never raise: each becomes a note, and the turn goes on with what is left. ``Intake.usable``
is false when nothing is left for the model (no text, every file refused): the turn then answers
with the notes alone and makes no model call (never an empty user message).

``resolve(history)`` reads exactly the blobs of the images a request sends (``render``), and
``model(inner)`` wraps the chat model so that an endpoint that refuses images (``llm.vision =
false``, or an API error saying images are unsupported) gets the text and the user a note.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from agent.model import ChatModel, ModelError, ModelReply, OnText
from gateway.core.config import MediaConfig
from gateway.core.errors import BlobMissing, DownloadFailed, FileTooBig, MediaError, NotDownloadable
from gateway.core.i18n import N_, _
from gateway.core.ports import BlobStore, can_download
from gateway.core.types import Attachment, InboundMessage, MediaRef
from gateway.media.contents import ContentReader, wants
from gateway.media.images import Rendition, is_image_type, sniff
from gateway.media.index import MediaIndex, Use
from gateway.media.isolated import MediaReaders
from gateway.media.render import ImagePolicy, has_images, quoted, resolve_images, strip_images
from gateway.media.transcribe import TranscriptionSpend
from gateway.store.text import file_name

log = logging.getLogger("gateway.media")

RunAsync = Callable[[Coroutine[Any, Any, Any], float], Any]
"""Runs a coroutine on the main loop from a worker thread and waits for its result (or raises)."""

DOWNLOAD_TIMEOUT_S = 120.0
DOWNLOAD_ATTEMPTS = 3
"""Tries of one download that fails retryably (a network error, a platform's 5xx)."""
ADAPTERS_READY_WAIT_S = 30.0
"""How long a turn resumed at start-up waits for the adapters before downloading its files."""
PICTURE_KINDS = frozenset({"image", "sticker", "animation"})
MAX_FILES_PER_MESSAGE = 10
"""Files of one message that are downloaded and read; the rest get a note. As many as a Telegram
album (``sendMediaGroup``: 2-10 items) or a web chat message holds; a Feishu rich-text post may embed
any number of images, each of which would go to the model in one request."""
_DECODABLE = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp", "image/bmp", "image/tiff"})
UNSUPPORTED_IMAGES = re.compile(
    r"image_url is only supported|only supported by certain models|invalid content type|not (a )?multi-?modal"
    r"|(does not|doesn't|do not|cannot|can't) (support|accept|process|handle) (image|vision|multi)"
    r"|(image|vision|multimodal)[a-z ]{0,20} (is|are) not (supported|enabled|available)|unsupported content"
    r"|no vision", re.IGNORECASE)
"""What a 4xx answer says when the model takes no images (OpenAI: "Invalid content type. image_url
is only supported by certain models."; vLLM/llama.cpp/Ollama: "... is not a multimodal model",
"image input is not supported")."""
NO_VISION_NOTE = N_("ℹ️ This model cannot see images, so I answered from your text only "
                    "(the operator can switch to a model with vision).")
"""Translated where it is told (``_(NO_VISION_NOTE)``)."""


@dataclass
class Intake:
    """What ``take_in`` made of one message: ``refs`` for the transcript, ``notes`` for the user,
    and whether anything is left for the model (``usable``)."""

    refs: list[MediaRef] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    usable: bool = True
    images: int = 0
    """Images the model can be shown (renditions made)."""
    transcripts: list[str] = field(default_factory=list)
    """What was heard in the message's voice notes and audio files (``media.show_transcript``)."""
    read: int = 0
    """Files whose contents were read (transcribed, extracted): the turn stores the message at once
    so that a run after a crash reuses them instead of calling the transcription API again."""
    spend: list[TranscriptionSpend] = field(default_factory=list)
    """What the message's transcriptions cost, one per call made: ``usage`` rows written with the
    user message (so a run after a crash, which finds the message and transcribes nothing, adds none)."""


class MediaService:
    """The media pipeline (see the module doc).

    Args:
        config: ``[media]``.
        vision: ``llm.vision``: the model takes image parts.
        blobs: the blob store; ``index``: the ``attachments`` table.
        adapters: platform name -> adapter (those with ``download`` are asked for the bytes).
        run_async: runs an adapter coroutine on the main loop (``None``: downloads are refused).
        reader: transcribes voice and audio, extracts documents' text, saves originals into the
            session's workspace (``gateway.media.contents``; ``None``: described in words only).
        readers: where images are decoded (``gateway.media.isolated``; default: in this thread).
        adapters_ready: waits up to the given seconds for the adapters to have started (a turn
            resumed at start-up runs before them); ``False``: they have not.
    """

    def __init__(self, config: MediaConfig, *, vision: bool, blobs: BlobStore, index: MediaIndex,
                 adapters: Mapping[str, object], run_async: RunAsync | None = None,
                 reader: ContentReader | None = None, readers: MediaReaders | None = None,
                 adapters_ready: Callable[[float], bool] | None = None) -> None:
        self.readers = readers or MediaReaders(processes=0)
        self.adapters_ready = adapters_ready
        self.config = config
        self.reader = reader
        self.vision = vision
        self.blobs = blobs
        self.index = index
        self.adapters = adapters
        self.run_async = run_async
        self._no_vision: set[str] = set()
        self._lock = threading.Lock()

    # -- what the model may see -----------------------------------------------------------
    def policy(self, model: str | None = None) -> ImagePolicy:
        """Which images go along as content parts for ``model``."""
        return ImagePolicy(vision=self.sees_images(model), history_images=self.config.history_images)

    def sees_images(self, model: str | None = None) -> bool:
        """``llm.vision``, unless the endpoint said this process that ``model`` takes no images."""
        with self._lock:
            return self.vision and (model is None or model not in self._no_vision)

    def resolve(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``history`` with its image placeholders replaced by data URLs of the stored renditions."""
        return resolve_images(history, self.blobs.get)

    def model(self, inner: ChatModel) -> VisionFallback:
        """A per-turn wrapper of ``inner`` that falls back to text when images are refused."""
        return VisionFallback(inner, self)

    def mark_no_vision(self, model: str) -> None:
        with self._lock:
            self._no_vision.add(model)

    # -- taking files in ------------------------------------------------------------------
    def take_in(self, message: InboundMessage, *, session_id: str, owner_user_id: str | None,
                turn_id: str) -> Intake:
        """Downloads, checks and stores the files of ``message`` (see the module doc). Never raises
        for a bad file; raises only on database faults."""
        intake = Intake()
        uses: list[Use] = []
        for attachment in message.attachments[:MAX_FILES_PER_MESSAGE]:
            ref, note = self._one(message, attachment, uses, session_id, intake)
            intake.refs.append(ref)
            if note:
                intake.notes.append(note_line(replace(ref, note=note)))
            if ref.image:
                intake.images += 1
        self._left_unread(message, intake)
        if uses:
            self.index.record(uses, session_id=session_id, owner_user_id=owner_user_id, turn_id=turn_id)
        intake.usable = bool(message.text.strip()) or any(r.note is None for r in intake.refs) \
            or message.command is not None
        return intake

    @staticmethod
    def _left_unread(message: InboundMessage, intake: Intake) -> None:
        """The files past ``MAX_FILES_PER_MESSAGE``: a reference with a note each (never
        downloaded), and one line telling the user."""
        rest = message.attachments[MAX_FILES_PER_MESSAGE:]
        if not rest:
            return
        why = f"only the first {MAX_FILES_PER_MESSAGE} files of a message are read"  # for the model: English
        intake.refs += [MediaRef(a.kind, a.mime_type or "application/octet-stream", a.size or 0, None,
                                 file_name(a.name), note=why) for a in rest]
        intake.notes.append(_("⚠️ I read the first {max} files of your message only; the other {more} were not "
                              "read (send them in another message).", max=MAX_FILES_PER_MESSAGE, more=len(rest)))

    def _one(self, message: InboundMessage, attachment: Attachment, uses: list[Use], session_id: str,
             intake: Intake) -> tuple[MediaRef, str | None]:
        name = file_name(attachment.name)
        ref = MediaRef(attachment.kind, attachment.mime_type or "application/octet-stream", attachment.size or 0,
                       None, name)
        if attachment.kind == "video" and not attachment.sha256:
            # The model cannot watch a video: it is described, with its thumbnail when there is one
            # (the video itself is not downloaded).
            return self._picture(message, ref, attachment.thumbnail_id, uses), None
        try:
            data, mime = self._fetch(message, attachment)
        except NotDownloadable:
            return ref, None  # described by its kind, as a video is
        except MediaError as exc:
            log.info("attachment %s of %s not taken: %s", attachment.kind, message.message_id, exc.user_message)
            return replace(ref, note=exc.user_message), exc.user_message
        stored = self.blobs.put(data, mime)
        uses.append(Use(stored.sha256, attachment.kind, mime, len(data), name))
        ref = replace(ref, mime_type=mime, size=len(data), sha256=stored.sha256)
        if attachment.kind not in PICTURE_KINDS and not is_image_type(mime):
            if self.reader is None or not wants(ref):
                return ref, None
            reading = self.reader.read(ref, data, session_id=session_id, duration_s=attachment.duration_s)
            intake.read += 1
            if reading.transcript is not None:
                intake.transcripts.append(reading.transcript)
            if reading.spend is not None:
                intake.spend.append(reading.spend)
            return reading.ref, reading.notice
        if sniff(data) in _DECODABLE:
            try:
                rendition = self.readers.prepare_image(data, self.config.image_max_side, self.config.image_max_bytes)
            except MediaError as exc:
                return replace(ref, note=exc.user_message), exc.user_message
            return self._with_rendition(ref, rendition, uses), None
        if attachment.thumbnail_id is not None:  # an animated sticker, a video animation
            return self._picture(message, ref, attachment.thumbnail_id, uses), None
        if attachment.kind in ("image",) or is_image_type(mime):
            why = ("it is a web page, not an image" if sniff(data) == "text/html"
                   else "it is not an image this gateway can read")
            return replace(ref, note=why), why
        return ref, None

    def _picture(self, message: InboundMessage, ref: MediaRef, thumbnail_id: str | None,
                 uses: list[Use]) -> MediaRef:
        """``ref`` with a rendition of its thumbnail, when one can be had (else ``ref`` as it is)."""
        if thumbnail_id is None:
            return ref
        try:
            data, _mime = self._fetch(message, Attachment("image", thumbnail_id, None, "image/jpeg"))
            rendition = self.readers.prepare_image(data, self.config.image_max_side, self.config.image_max_bytes)
        except MediaError:
            return ref
        return self._with_rendition(ref, rendition, uses)

    def _with_rendition(self, ref: MediaRef, rendition: Rendition, uses: list[Use]) -> MediaRef:
        stored = self.blobs.put(rendition.data, rendition.mime_type)
        uses.append(Use(stored.sha256, ref.kind, rendition.mime_type, len(rendition.data), ref.name, "rendition"))
        return replace(ref, image={"sha256": stored.sha256, "mime_type": rendition.mime_type,
                                   "size": len(rendition.data), "width": rendition.width,
                                   "height": rendition.height})

    def _fetch(self, message: InboundMessage, attachment: Attachment) -> tuple[bytes, str]:
        """The bytes and their type, within the gateway's and the platform's limits."""
        limit = self.config.max_bytes(attachment.kind)
        if attachment.size is not None and attachment.size > limit:
            raise FileTooBig(attachment.size, limit, "this gateway", f"{attachment.kind} files")
        longest = self.config.audio_max_minutes * 60
        stated = attachment.duration_s or 0.0
        if attachment.kind in ("voice", "audio") and stated > longest:
            # transcription is paid by the minute: 25 MB of 6 kbit/s Opus is nine hours
            raise MediaError(f"it is too long ({stated / 60:.0f} min); this gateway transcribes "
                             f"up to {self.config.audio_max_minutes:g} min")
        if attachment.sha256:  # already stored (a web chat upload)
            try:
                data = self.blobs.get(attachment.sha256)
            except BlobMissing:
                raise DownloadFailed("the upload is no longer stored; please send it again") from None
            if len(data) > limit:  # the size checked above is the one the browser claimed
                raise FileTooBig(len(data), limit, "this gateway", f"{attachment.kind} files")
            return data, attachment.mime_type or sniff(data) or "application/octet-stream"
        adapter = self.adapters.get(message.platform)
        if adapter is None or not can_download(adapter) or self.run_async is None:
            raise DownloadFailed(f"files from {message.platform} cannot be downloaded here")
        if self.adapters_ready is not None and not self.adapters_ready(ADAPTERS_READY_WAIT_S):
            raise DownloadFailed(f"the connection to {message.platform} is not up yet", retryable=True)
        data, served = self._download(adapter, message, attachment, limit)
        if len(data) > limit:
            raise FileTooBig(len(data), limit, "this gateway", f"{attachment.kind} files")
        if not data:
            raise DownloadFailed("the file is empty")
        found = sniff(data)
        mime = attachment.mime_type or served
        if found and (found == "text/html" or not mime or mime == "application/octet-stream"
                      or (is_image_type(found) != is_image_type(mime))):
            mime = found  # what the bytes are beats what was declared
        return data, (mime or "application/octet-stream").split(";")[0].strip()


    @retry(retry=retry_if_exception(lambda exc: isinstance(exc, DownloadFailed) and exc.retryable),
           stop=stop_after_attempt(DOWNLOAD_ATTEMPTS), wait=wait_exponential(multiplier=0.5, max=4), reraise=True)
    def _download(self, adapter: object, message: InboundMessage, attachment: Attachment,
                  limit: int) -> tuple[bytes, str]:
        """The adapter's download, tried again after a network error, a timeout or a 5xx
        (``DownloadFailed.retryable``; ``DOWNLOAD_ATTEMPTS`` in all, 0.5 s then 1 s apart)."""
        try:
            return self.run_async(adapter.download(message, attachment, limit),  # type: ignore[attr-defined,misc]
                                  DOWNLOAD_TIMEOUT_S)
        except MediaError:
            raise
        except TimeoutError:  # DOWNLOAD_TIMEOUT_S spent: not again
            raise DownloadFailed("the download took too long") from None
        except Exception as exc:  # an adapter bug must not fail the turn
            log.warning("download of a %s from %s failed: %s", attachment.kind, message.platform, exc)
            raise DownloadFailed("the download failed") from None


def note_line(ref: MediaRef) -> str:
    """What the user is told about a file that could not be used (``ref.note``): ``⚠️ I could not
    use "big.zip": too big (30.0 MB); ...``; the same line again when a turn runs after a crash."""
    return _("⚠️ I could not use {file}: {why}.", file=_label(ref), why=ref.note)


def _label(ref: MediaRef) -> str:
    """How a note names a file: its quoted name, else ``your voice message``, ``the audio``..."""
    if ref.name:
        return quoted(ref.name)
    return _("your voice message") if ref.kind == "voice" else _("the {kind}", kind=ref.kind)


class VisionFallback:
    """A chat model for one turn: images go along while the model takes them; when it refuses them
    (a 4xx whose message says so) the same request is sent again without them, the model is
    remembered as blind in this process, and ``fell_back`` tells the turn to add a note."""

    def __init__(self, inner: ChatModel, media: MediaService) -> None:
        self.inner = inner
        self.media = media
        self.model = inner.model
        self.fell_back = False

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_text: OnText | None = None) -> ModelReply:
        if not has_images(messages):
            return self.inner.complete(messages, tools, on_text)
        if not self.media.sees_images(self.model):
            self.fell_back = True
            return self.inner.complete(strip_images(messages, "this model cannot see images"), tools, on_text)
        try:
            return self.inner.complete(messages, tools, on_text)
        except ModelError as exc:
            if exc.status not in (400, 404, 415, 422) or not UNSUPPORTED_IMAGES.search(str(exc)):
                raise
            log.warning("model %s refused images (%s); sending text only from now on", self.model, exc)
            self.media.mark_no_vision(self.model)
            self.fell_back = True
            return self.inner.complete(strip_images(messages, "this model cannot see images"), tools, on_text)
