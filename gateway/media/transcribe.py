"""Voice and audio to text through an OpenAI-compatible ``POST /v1/audio/transcriptions``.

The API (OpenAI: "Speech to text") takes a multipart upload: ``file`` (at most 25 MB, its
*file name's extension* names the format: flac, m4a, mp3, mp4, mpeg, mpga, ogg, wav, webm) and
``model`` (``whisper-1``, ``gpt-4o-mini-transcribe``, ``gpt-4o-transcribe``; a local
faster-whisper or whisper.cpp server takes its own names). The container is recognised from
the bytes (Telegram voice notes are OGG/Opus, Slack clips WebM or MP4, Feishu audio OGG/Opus), so
the upload is named ``voice.ogg``, ``audio.m4a``... whatever the platform called the file: the
user's own file name never leaves the gateway.

``Transcriber.transcribe`` runs on a turn's worker thread (the sync ``openai`` client, with its
retries) and raises ``TranscriptionError`` with a sentence for the user on every failure.

What a transcription costs (``Transcriber.spend`` -> ``TranscriptionSpend``, a ``usage`` row of the
turn) is the audio's duration in minutes times ``llm.transcription_prices`` of the model (USD per
minute). The duration is the one the API reports (``usage: {"type": "duration", "seconds"}`` from
``whisper-1``, or ``duration`` of a ``verbose_json`` answer), else the one the file's container
declares (``audio_seconds``: Ogg, MP3, MP4/M4A, WAV, FLAC), else the one the platform stated
(Telegram's and Feishu's voice and audio messages carry it), else unknown: such a transcription is
recorded at 0 USD (the gpt-4o models report tokens, not seconds, and a WebM clip from Slack or the
web chat states none). What the sender controls (the container's header, the stated duration;
Telegram Bot API: ``Voice.duration`` is "as defined by the sender") is capped by what the file's
size can hold (``most_seconds``), so a one-second note claiming 2^31 s costs seconds, not a day's
budget (found by a review). Tokens are recorded when the API reports them (the gpt-4o models'
``usage: {"type": "tokens", "input_tokens", "output_tokens"}``), else 0.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import mutagen
import openai

from gateway.core.config import LlmConfig
from gateway.core.providers import DEFAULT_PROVIDER

log = logging.getLogger("gateway.media.transcribe")

MAX_BYTES = 25 * 1024 * 1024
"""OpenAI: "File uploads are currently limited to 25 MB" (26,214,400 bytes; larger uploads get 413)."""
MIN_BITRATE_BPS = 2_000
"""Bits per second below which no audio the API takes is encoded (Opus' floor is 6 kb/s, MP3's
8 kb/s; only Opus' silence suppression goes lower): a file of n bytes lasts at most
``n * 8 / MIN_BITRATE_BPS`` seconds (``most_seconds``), whatever its header or the sender says."""
SUPPORTED_FORMATS = ("flac", "m4a", "mp3", "mp4", "mpeg", "mpga", "ogg", "wav", "webm")
"""The extensions ``/v1/audio/transcriptions`` accepts (anything else: 400 "Invalid file format")."""
CONTENT_TYPES = {"flac": "audio/flac", "m4a": "audio/mp4", "mp3": "audio/mpeg", "mp4": "audio/mp4",
                 "mpeg": "audio/mpeg", "mpga": "audio/mpeg", "ogg": "audio/ogg", "wav": "audio/wav",
                 "webm": "audio/webm"}
_MIME_FORMATS = {
    "audio/ogg": "ogg", "audio/opus": "ogg", "audio/x-opus+ogg": "ogg", "application/ogg": "ogg",
    "audio/mpeg": "mp3", "audio/mp3": "mp3", "audio/mpeg3": "mp3", "audio/x-mpeg-3": "mp3",
    "audio/mp4": "m4a", "audio/m4a": "m4a", "audio/x-m4a": "m4a", "audio/aac-mp4": "m4a", "video/mp4": "mp4",
    "audio/wav": "wav", "audio/x-wav": "wav", "audio/wave": "wav", "audio/vnd.wave": "wav",
    "audio/webm": "webm", "video/webm": "webm", "audio/flac": "flac", "audio/x-flac": "flac",
}


class TranscriptionError(Exception):
    """A transcription that did not happen. ``user_message`` says why as a clause that completes
    "I could not use your voice message: …" (no secret, no internal detail); ``str(exc)`` is for
    the log."""

    def __init__(self, message: str, user_message: str) -> None:
        super().__init__(message)
        self.user_message = user_message


TRANSCRIPTION_PROVIDER = "transcription"
"""The ``usage.provider`` of transcriptions on an endpoint of their own (``llm.transcription_base_url``)
that is no configured provider's."""


@dataclass(frozen=True, slots=True)
class Transcript:
    """What the model was told the audio says: ``text`` (stripped, may be ``""`` for silence),
    the ``model`` that heard it, and the ``upload_name`` it was sent as (``voice.ogg``).

    What the API reported about the call: ``seconds``, the audio's duration (``None`` when the
    answer gives none); ``input_tokens`` and ``output_tokens`` (0 when it reports none)."""

    text: str
    model: str
    upload_name: str
    seconds: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class TranscriptionSpend:
    """What one transcription cost, for its ``usage`` row (``TurnRunner`` adds the user, chat and day).

    Attributes:
        provider: ``usage.provider`` (``default``: the chat endpoint ``llm.base_url``; a provider's
            name when ``llm.transcription_base_url`` is its ``base_url``; else ``transcription``).
        model: the transcription model.
        seconds: the audio's duration the cost was computed from, in seconds; ``None``: unknown.
        duration_from: where ``seconds`` came from: ``api`` (the answer), ``file`` (the audio's
            container), ``platform`` (the attachment's stated duration) or ``unknown``.
        input_tokens, output_tokens: as the API reported them (0 when it did not).
        cost_usd: ``seconds / 60 * price_per_minute`` (0 when ``seconds`` is unknown).
    """

    provider: str
    model: str
    seconds: float | None
    duration_from: Literal["api", "file", "platform", "unknown"]
    input_tokens: int
    output_tokens: int
    cost_usd: float

    def to_dict(self) -> dict[str, Any]:
        """What the user message's ``meta["transcriptions"]`` keeps of it (JSON)."""
        return {"provider": self.provider, "model": self.model, "seconds": self.seconds,
                "duration_from": self.duration_from, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "cost_usd": self.cost_usd}


def audio_format(data: bytes, mime: str | None = None, name: str | None = None) -> str | None:
    """The upload extension for these bytes (one of ``SUPPORTED_FORMATS``), or ``None`` when the
    API would refuse them (AMR, raw AAC, ...).

    The container's signature decides (``OggS``, ``fLaC``, ``RIFF…WAVE``, ``ID3`` or an MPEG audio
    frame, ``…ftyp`` (``M4A`` brand: m4a, else mp4), the EBML header of WebM); then the MIME type;
    then the file name's extension.
    """
    head = data[:64]
    if head.startswith(b"OggS"):
        return "ogg"
    if head.startswith(b"fLaC"):
        return "flac"
    if head.startswith(b"RIFF") and head[8:12] == b"WAVE":
        return "wav"
    if head[4:8] == b"ftyp":
        return "m4a" if head[8:11] == b"M4A" else "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return "webm"
    if head.startswith(b"ID3") or (len(head) > 1 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0
                                   and head[1] & 0x06 != 0):  # MPEG audio frame sync, layer not 0 (ADTS AAC)
        return "mp3"
    if head[:2] in (b"\xff\xf1", b"\xff\xf9") or head.startswith((b"#!AMR", b"ADIF")):
        return None  # raw AAC or AMR: not among the formats the API takes
    fmt = _MIME_FORMATS.get((mime or "").split(";", 1)[0].strip().lower())
    if fmt is None and name and "." in name:
        ext = name.rsplit(".", 1)[1].lower()
        fmt = "ogg" if ext in ("oga", "opus") else ext if ext in SUPPORTED_FORMATS else None
    return fmt


class Transcriber:
    """Speech to text with one model on one OpenAI-compatible endpoint.

    Args:
        base_url: the API root (``https://api.openai.com/v1``; a local server's ``http://host:8000/v1``).
        api_key: its key (local servers take any non-empty string).
        model: the transcription model (``llm.transcription_model``).
        language: ISO-639-1 hint (``"en"``, ``"de"``), or ``None`` to let the model detect it.
        timeout_s, max_retries: per request, as for chat calls (the client retries 408, 409, 429
            and 5xx with backoff).
        max_bytes: larger audio is refused before any upload (the API's 25 MB by default).
        client: an ``openai.OpenAI`` to use instead (tests).
        provider: the ``usage.provider`` its calls are recorded under.
        price_per_minute: USD per minute of audio (``llm.transcription_prices`` of ``model``; 0: free).
    """

    def __init__(self, *, base_url: str, api_key: str | None, model: str, language: str | None = None,
                 timeout_s: float = 120.0, max_retries: int = 2, max_bytes: int = MAX_BYTES,
                 client: openai.OpenAI | None = None, provider: str = DEFAULT_PROVIDER,
                 price_per_minute: float = 0.0) -> None:
        self.model = model
        self.provider = provider
        self.price_per_minute = price_per_minute
        self.language = language
        self.max_bytes = max_bytes
        self._client = client or openai.OpenAI(base_url=base_url, api_key=api_key or "not-needed",
                                               timeout=timeout_s, max_retries=max_retries)

    def transcribe(self, data: bytes, *, kind: str = "audio", mime: str | None = None,
                   name: str | None = None) -> Transcript:
        """The text spoken in ``data`` (a voice note when ``kind == "voice"``, else an audio file).

        Raises:
            TranscriptionError: too large, a format the API does not take, or the API failed
                (after the client's retries); ``user_message`` says which.
        """
        what = "voice message" if kind == "voice" else "audio file"
        if len(data) > self.max_bytes:
            raise TranscriptionError(
                f"{what} of {len(data)} bytes over the {self.max_bytes}-byte limit",
                f"it is {len(data) / 2**20:.1f} MB, more than the {self.max_bytes / 2**20:.0f} MB the transcription "
                "service takes, so it was not transcribed")
        fmt = audio_format(data, mime, name)
        if fmt is None:
            raise TranscriptionError(f"{what} in an unsupported format (mime {mime!r})",
                                     f"its format ({mime or 'unknown type'}) is not one the transcription service "
                                     f"takes ({', '.join(SUPPORTED_FORMATS)})")
        upload = f"{'voice' if kind == 'voice' else 'audio'}.{fmt}"
        extra = {"language": self.language} if self.language else {}
        try:
            result = self._client.audio.transcriptions.create(
                model=self.model, file=(upload, data, CONTENT_TYPES[fmt]), **extra)  # type: ignore[call-overload]
        except openai.APIStatusError as exc:
            status = exc.status_code
            detail = _api_message(exc)
            log.warning("transcription of a %s (%s, %d bytes) failed: HTTP %s %s", what, upload, len(data), status,
                        detail)
            if status in (401, 403):
                said = "refused the API key (see llm.transcription_api_key_env)"
            elif status == 404:
                said = f"does not know the model {self.model!r} or has no transcription endpoint"
            elif status == 429:
                said = "is rate-limited or out of quota right now"
            else:
                said = f"answered {status}" + (f": {detail}" if detail else "")
            raise TranscriptionError(f"HTTP {status}: {detail}",
                                     f"it could not be transcribed: the transcription service {said}") from None
        except openai.APIError as exc:  # connection errors and timeouts, after the retries
            log.warning("transcription of a %s failed: %s", what, type(exc).__name__)
            raise TranscriptionError(type(exc).__name__, "it could not be transcribed: the transcription service "
                                                         "could not be reached") from None
        text = getattr(result, "text", result if isinstance(result, str) else "")
        seconds, tokens_in, tokens_out = _reported(result)
        return Transcript(str(text).strip(), self.model, upload, seconds, tokens_in, tokens_out)

    def spend(self, heard: Transcript, stated_s: float | None = None, data: bytes | None = None) -> TranscriptionSpend:
        """What ``heard`` cost: its duration in seconds times ``price_per_minute`` / 60. The
        duration: the API's ``heard.seconds``, else what ``data`` (the audio sent) declares
        (``audio_seconds``), else ``stated_s`` (the platform's stated duration), else unknown (0 USD);
        the last two capped by ``most_seconds(len(data))`` when ``data`` is given."""
        source: Literal["api", "file", "platform"]
        declared = audio_seconds(data) if data is not None and heard.seconds is None else None
        if heard.seconds is not None:
            seconds, source = float(heard.seconds), "api"
        elif declared is not None and declared > 0:
            seconds, source = declared, "file"
        elif stated_s is not None and stated_s > 0:
            seconds, source = float(stated_s), "platform"
        else:
            log.info("transcription by %s: the audio's duration is unknown, recorded at 0 USD", heard.model)
            return TranscriptionSpend(self.provider, heard.model, None, "unknown", heard.input_tokens,
                                      heard.output_tokens, 0.0)
        if source != "api" and data is not None and seconds > (most := most_seconds(len(data))):
            log.info("transcription of %d bytes: the %s said %.0f s, counted as %.0f s (what the size holds)",
                     len(data), "file" if source == "file" else "sender", seconds, most)
            seconds = most
        cost = round(seconds / 60.0 * self.price_per_minute, 8)
        return TranscriptionSpend(self.provider, heard.model, seconds, source, heard.input_tokens,
                                  heard.output_tokens, cost)


def audio_seconds(data: bytes) -> float | None:
    """How long ``data`` lasts, in seconds, as its container declares it (mutagen: Ogg Opus and
    Vorbis, MP3, MP4/M4A, WAV, FLAC); ``None`` when it declares nothing readable (WebM, which
    mutagen does not parse, or a damaged file). The header is the sender's: cap it (``most_seconds``)."""
    try:
        parsed = mutagen.File(io.BytesIO(data))
    except Exception:  # mutagen raises its own errors and, on damaged input, struct and index errors
        return None
    return _number(getattr(getattr(parsed, "info", None), "length", None))


def most_seconds(size: int) -> float:
    """The longest audio ``size`` bytes can hold, in seconds, at ``MIN_BITRATE_BPS``."""
    return size * 8 / MIN_BITRATE_BPS


def _reported(result: object) -> tuple[float | None, int, int]:
    """``(seconds, input tokens, output tokens)`` an answer of ``/v1/audio/transcriptions`` reports:
    ``usage`` of type ``duration`` (``seconds``; ``whisper-1``) or ``tokens`` (``input_tokens``,
    ``output_tokens``; the gpt-4o models), or a ``verbose_json`` answer's ``duration``. What it does
    not report is ``None`` (seconds) or 0 (tokens); a plain-text answer reports nothing."""
    usage = getattr(result, "usage", None)
    seconds = _number(getattr(usage, "seconds", None)) if getattr(usage, "type", None) == "duration" else None
    if seconds is None:
        seconds = _number(getattr(result, "duration", None))
    tokens_in = tokens_out = 0
    if getattr(usage, "type", None) == "tokens":
        tokens_in = int(_number(getattr(usage, "input_tokens", None)) or 0)
        tokens_out = int(_number(getattr(usage, "output_tokens", None)) or 0)
    return seconds, tokens_in, tokens_out


def _number(value: object) -> float | None:
    """``value`` as a finite number that is not negative, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if 0 <= number < float("inf") else None


def build_transcriber(llm: LlmConfig, secret: Callable[[str], str | None]) -> Transcriber | None:
    """The transcriber ``[llm]`` asks for (``transcription_*``, falling back to the chat endpoint
    and key), or ``None`` when ``transcription_model`` is empty. ``secret`` reads a variable."""
    if not llm.transcription_model:
        return None
    return Transcriber(base_url=llm.transcription_base_url or llm.base_url,
                       api_key=secret(llm.transcription_api_key_env or llm.api_key_env),
                       model=llm.transcription_model, language=llm.transcription_language,
                       timeout_s=llm.timeout_s, max_retries=llm.max_retries,
                       provider=transcription_provider(llm),
                       price_per_minute=llm.transcription_price(llm.transcription_model))


def transcription_provider(llm: LlmConfig) -> str:
    """The provider name transcriptions are recorded under: ``default`` on the chat endpoint
    (``llm.transcription_base_url`` unset or ``llm.base_url``), the name of the ``[[llm.providers]]``
    entry whose ``base_url`` it is, else ``TRANSCRIPTION_PROVIDER``."""
    url = (llm.transcription_base_url or "").rstrip("/")
    if not url or url == llm.base_url.rstrip("/"):
        return DEFAULT_PROVIDER
    return next((p.name for p in llm.providers if p.base_url.rstrip("/") == url), TRANSCRIPTION_PROVIDER)


def _api_message(exc: openai.APIStatusError) -> str:
    """The API's ``error.message`` (or the first 200 characters of the body), one line."""
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    if not message and isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = body["error"].get("message")
    text = str(message or exc.response.text or "")
    return " ".join(text.split())[:200]
