"""Speech to text (``gateway.media.transcribe``) through the real ``openai`` client against the
fake OpenAI's ``/v1/audio/transcriptions``, and the fake's own strictness (as the real API's)."""

from __future__ import annotations

import httpx
import pytest

from gateway.core.config import load_config
from gateway.core.errors import ConfigError
from gateway.media.transcribe import (
    Transcriber,
    Transcript,
    TranscriptionError,
    TranscriptionSpend,
    audio_format,
    audio_seconds,
    build_transcriber,
    most_seconds,
)
from tests import media_samples as samples
from tests.fakes.openai import error


@pytest.fixture
def fake(fake_openai):
    fake_openai.reset()
    yield fake_openai
    fake_openai.reset()


def transcriber(fake, **kwargs) -> Transcriber:
    options = {"base_url": f"{fake.url}/v1", "api_key": "sk-test", "model": "gpt-4o-mini-transcribe",
               "max_retries": 0, **kwargs}
    return Transcriber(**options)


def test_a_telegram_voice_note_is_uploaded_as_voice_ogg_with_the_model(fake):
    fake.script_transcription("Remind me to call Ana at five.")
    voice = samples.ogg_opus(b"\x01" * 2000)
    got = transcriber(fake).transcribe(voice, kind="voice", mime="audio/ogg")
    assert got.text == "Remind me to call Ana at five."
    assert (got.model, got.upload_name) == ("gpt-4o-mini-transcribe", "voice.ogg")
    [upload] = fake.transcriptions
    assert (upload["status"], upload["filename"], upload["content_type"], upload["model"]) == \
        (200, "voice.ogg", "audio/ogg", "gpt-4o-mini-transcribe")
    assert upload["size"] == len(voice)
    assert upload["headers"]["authorization"] == "Bearer sk-test"


def test_the_container_is_read_from_the_bytes_not_the_name():
    assert audio_format(samples.ogg_opus(), "application/octet-stream", "voice.opus") == "ogg"
    assert audio_format(samples.wav(), "audio/ogg", "x.ogg") == "wav"
    assert audio_format(b"ID3\x04" + bytes(20)) == "mp3"
    assert audio_format(b"\x00\x00\x00\x1cftypM4A " + bytes(20)) == "m4a"
    assert audio_format(b"\x00\x00\x00\x1cftypisom" + bytes(20)) == "mp4"
    assert audio_format(b"\x1a\x45\xdf\xa3" + bytes(20), "audio/webm") == "webm"
    assert audio_format(b"#!AMR\n" + bytes(20), "audio/amr", "memo.amr") is None
    assert audio_format(b"\xff\xf1\x50\x80" + bytes(20), "audio/aac") is None  # raw AAC (ADTS)
    assert audio_format(bytes(20), "audio/mpeg") == "mp3"  # nothing recognisable: the declared type


def test_an_audio_file_is_sent_under_a_neutral_name(fake):
    fake.script_transcription("Minutes of the meeting.")
    got = transcriber(fake, model="whisper-1").transcribe(samples.wav(), kind="audio", mime="audio/x-wav",
                                                          name='meeting "board".wav')
    assert got.upload_name == "audio.wav"
    assert fake.transcriptions[0]["filename"] == "audio.wav"  # the user's file name stays here


def test_an_unsupported_format_is_refused_before_any_upload(fake):
    with pytest.raises(TranscriptionError) as raised:
        transcriber(fake).transcribe(b"#!AMR\n" + bytes(200), kind="voice", mime="audio/amr")
    assert "format" in raised.value.user_message and "audio/amr" in raised.value.user_message
    assert fake.transcriptions == []


def test_audio_over_25_mb_is_refused_before_any_upload(fake):
    with pytest.raises(TranscriptionError) as raised:
        transcriber(fake).transcribe(samples.ogg_opus() + bytes(26 * 1024 * 1024), kind="voice")
    assert "25 MB" in raised.value.user_message
    assert fake.transcriptions == []


@pytest.mark.parametrize("reply, said", [
    (error(500, "The server had an error while processing your request.", "server_error"), "answered 500"),
    (error(429, "Rate limit reached", "requests", "rate_limit_exceeded"), "rate-limited"),
    (error(400, "Audio file is too short. Minimum audio length is 0.1 seconds.", code="audio_too_short"),
     "Audio file is too short"),
])
def test_an_api_failure_is_a_sentence_for_the_user(fake, reply, said):
    fake.script_transcription(reply)
    with pytest.raises(TranscriptionError) as raised:
        transcriber(fake).transcribe(samples.ogg_opus(), kind="voice")
    assert said in raised.value.user_message
    assert raised.value.user_message.startswith("it could not be transcribed: the transcription service ")


def test_a_wrong_key_is_named_by_its_setting_never_shown(fake):
    with pytest.raises(TranscriptionError) as raised:
        transcriber(fake, api_key="sk-wrong-key-123456").transcribe(samples.ogg_opus(), kind="voice")
    assert "llm.transcription_api_key_env" in raised.value.user_message
    assert "sk-" not in raised.value.user_message and "3456" not in raised.value.user_message
    assert fake.transcriptions[0]["status"] == 401


def test_an_unknown_model_is_said(fake):
    with pytest.raises(TranscriptionError) as raised:
        transcriber(fake, model="whisper-large-v9").transcribe(samples.ogg_opus(), kind="voice")
    assert "'whisper-large-v9'" in raised.value.user_message


def test_an_unreachable_service_is_said(fake):
    dead = Transcriber(base_url="http://127.0.0.1:9/v1", api_key="x", model="whisper-1", max_retries=0,
                       timeout_s=2)
    with pytest.raises(TranscriptionError) as raised:
        dead.transcribe(samples.ogg_opus(), kind="voice")
    assert "could not be reached" in raised.value.user_message


# ---- what a transcription costs ------------------------------------------------------------------


def test_whisper_reports_the_audios_duration_and_the_gpt_4o_models_tokens(fake):
    voice = samples.ogg_opus(b"\x01" * 2000, seconds=42)
    fake.script_transcription("hello there", "hello there")
    heard = transcriber(fake, model="whisper-1").transcribe(voice, kind="voice")
    assert (heard.seconds, heard.input_tokens, heard.output_tokens) == (42, 0, 0)
    tokens = transcriber(fake, model="gpt-4o-mini-transcribe").transcribe(voice, kind="voice")
    assert tokens.seconds is None and tokens.input_tokens == 420 and tokens.output_tokens > 0


def test_the_cost_is_minutes_of_audio_at_the_price_the_apis_duration_first():
    costly = Transcriber(base_url="http://127.0.0.1:9/v1", api_key="x", model="whisper-1", price_per_minute=0.006)
    reported = Transcript("hi", "whisper-1", "voice.ogg", seconds=90)
    assert costly.spend(reported, stated_s=91) == TranscriptionSpend("default", "whisper-1", 90.0, "api", 0, 0, 0.009)
    unreported = Transcript("hi", "gpt-4o-transcribe", "voice.ogg", input_tokens=900, output_tokens=3)
    assert costly.spend(unreported, stated_s=30) == \
        TranscriptionSpend("default", "gpt-4o-transcribe", 30.0, "platform", 900, 3, 0.003)
    assert costly.spend(unreported) == \
        TranscriptionSpend("default", "gpt-4o-transcribe", None, "unknown", 900, 3, 0.0)  # recorded, at 0 USD


def test_what_the_sender_controls_is_capped_by_what_the_files_size_holds():
    """A gpt-4o model reports no seconds: the container's declared duration counts, else the
    platform's stated one, both capped by ``most_seconds`` of the bytes sent (Telegram: a voice
    note's duration is "as defined by the sender"; found by a review: 2^31 s cost $107,374)."""
    costly = Transcriber(base_url="http://127.0.0.1:9/v1", api_key="x", model="gpt-4o-transcribe",
                         price_per_minute=0.006)
    heard = Transcript("hi", "gpt-4o-transcribe", "voice.ogg", input_tokens=10, output_tokens=1)
    honest = samples.ogg_opus(b"\x01" * 60_000, seconds=30)  # 16 kbit/s
    spent = costly.spend(heard, stated_s=2**31 - 1, data=honest)
    assert (spent.duration_from, round(spent.seconds, 2), round(spent.cost_usd, 5)) == ("file", 29.99, 0.003)
    lying = samples.ogg_opus(b"\x01" * 4_000, seconds=2**31 / 48000 * 1000)  # a header claiming 2^31 s
    spent = costly.spend(heard, stated_s=2**31 - 1, data=lying)
    assert spent.duration_from == "file" and spent.seconds == most_seconds(len(lying)) < 20
    webm = b"\x1aE\xdf\xa3" + b"\x00" * 5_000  # a container mutagen does not read: the stated duration
    spent = costly.spend(heard, stated_s=2**31 - 1, data=webm)
    assert spent.duration_from == "platform" and spent.seconds == most_seconds(len(webm)) == 20.016
    assert costly.spend(heard, stated_s=12, data=webm).seconds == 12  # an honest statement stands
    assert audio_seconds(b"OggS" + b"\xff" * 100) is None  # damaged: nothing declared, no error
    assert costly.spend(heard, data=webm).duration_from == "unknown"


def test_prices_per_minute_default_to_openais_and_unlisted_models_cost_nothing():
    llm = load_config(None, llm={"transcription_prices": {"local-whisper": 0.001}}).llm
    assert (llm.transcription_price("whisper-1"), llm.transcription_price("gpt-4o-transcribe"),
            llm.transcription_price("gpt-4o-mini-transcribe")) == (0.006, 0.006, 0.003)
    assert llm.transcription_price("gpt-4o-mini-transcribe-2025-03-20") == 0.003  # a dated snapshot
    assert (llm.transcription_price("local-whisper"), llm.transcription_price("Systran/faster-whisper")) == (0.001, 0)
    with pytest.raises(ConfigError):
        load_config(None, llm={"transcription_prices": {"whisper-1": -1}})


def test_transcriptions_are_recorded_under_the_provider_of_their_endpoint():
    def provider(**llm: object) -> str:
        built = build_transcriber(load_config(None, llm=llm).llm, lambda name: None)
        assert built is not None
        return built.provider

    local = {"name": "local", "base_url": "http://127.0.0.1:8000/v1", "models": {"qwen": {}}}
    assert provider() == "default"  # the chat endpoint, llm.base_url
    assert provider(transcription_base_url="http://127.0.0.1:8000/v1/", providers=[local]) == "local"
    assert provider(transcription_base_url="http://127.0.0.1:9000/v1") == "transcription"
    assert build_transcriber(load_config(None, llm={"transcription_model": "gpt-4o-mini-transcribe"}).llm,
                             lambda name: None).price_per_minute == 0.003


# ---- the fake is as strict as the real endpoint ------------------------------------------------


def post(fake, files=None, data=None, key="sk-test", **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{fake.url}/v1/audio/transcriptions", files=files, data=data, headers=headers, timeout=30,
                      **kwargs)


def test_fake_refuses_a_file_name_without_a_supported_extension(fake):
    reply = post(fake, files={"file": ("voice.opus", samples.ogg_opus(), "audio/opus")}, data={"model": "whisper-1"})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"].startswith("Invalid file format. Supported formats: ['flac', ")


def test_fake_refuses_bytes_that_are_not_audio(fake):
    reply = post(fake, files={"file": ("voice.ogg", b"<html>sign in</html>", "audio/ogg")}, data={"model": "whisper-1"})
    assert reply.status_code == 400
    assert reply.json()["error"]["message"] == "Audio file might be corrupted or unsupported"


def test_fake_needs_the_model_the_file_and_multipart(fake):
    no_model = post(fake, files={"file": ("voice.ogg", samples.ogg_opus(), "audio/ogg")})
    assert no_model.status_code == 400 and "model" in no_model.json()["error"]["message"]
    no_file = post(fake, files={"x": ("a", b"", "text/plain")}, data={"model": "whisper-1"})
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    as_json = httpx.post(f"{fake.url}/v1/audio/transcriptions", json={"model": "whisper-1"},
                         headers={"Authorization": "Bearer sk-test"})
    assert as_json.status_code == 400 and "multipart/form-data" in as_json.json()["error"]["message"]
    no_key = post(fake, files={"file": ("voice.ogg", samples.ogg_opus(), "audio/ogg")},
                  data={"model": "whisper-1"}, key="")
    assert no_key.status_code == 401


def test_fake_answers_413_over_25_mb(fake):
    big = samples.ogg_opus() + bytes(26_214_400)
    reply = post(fake, files={"file": ("voice.ogg", big, "audio/ogg")}, data={"model": "whisper-1"})
    assert reply.status_code == 413
    assert reply.json()["error"]["message"].startswith("Maximum content size limit (26214400) exceeded (")


def test_fake_answers_text_and_refuses_verbose_json_for_gpt_4o_models(fake):
    fake.script_transcription("hello there")
    plain = post(fake, files={"file": ("a.wav", samples.wav(), "audio/wav")},
                 data={"model": "whisper-1", "response_format": "text"})
    assert (plain.status_code, plain.text) == (200, "hello there\n")
    verbose = post(fake, files={"file": ("a.wav", samples.wav(), "audio/wav")},
                   data={"model": "gpt-4o-mini-transcribe", "response_format": "verbose_json"})
    assert verbose.status_code == 400 and "not compatible" in verbose.json()["error"]["message"]
