"""Speech to text is spend: a voice note's transcription is a ``usage`` row of its turn, priced per
minute of audio (``llm.transcription_prices``), written with the user message that carries the
transcript; ``/usage`` shows it and the usage limits count it. End to end: python-telegram-bot
against the fake Telegram (``getFile`` and the file route), the openai client against the fake
model's ``/v1/audio/transcriptions`` (which reports the audio's duration for ``whisper-1`` and
tokens for the gpt-4o models, as OpenAI does) and chat completions. A turn replayed after a crash
is in ``tests/test_media_replay.py``."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from gateway.store.models import MessageRow, UsageRow
from tests import media_samples as samples
from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.test_limits_e2e import command, statuses, texts
from tests.test_telegram_e2e import dm_update
from tests.test_web_admin import ADMIN, Operator

FREE_CHAT = {"gpt-4o-mini": {"input": 0.0, "output": 0.0}}
"""The chat model costs nothing here, so every cent counted is the transcription's."""
CHAT_USAGE = oa.usage(100, 5)


def voice_update(chat: int, message_id: int, file_id: str, size: int, stated_s: int) -> dict[str, Any]:
    """A Telegram voice note (OGG/Opus) whose ``duration`` Telegram states as ``stated_s`` seconds."""
    return {"message": {"message_id": message_id, "date": int(time.time()),
                        "from": {"id": chat, "is_bot": False, "first_name": "Alice"},
                        "chat": {"id": chat, "first_name": "Alice", "type": "private"},
                        "voice": {"file_id": file_id, "file_unique_id": f"u{file_id}"[:32], "duration": stated_s,
                                  "mime_type": "audio/ogg", "file_size": size}}}


def usage_rows(gateway) -> list[Any]:
    with gateway.engine.connect() as conn:
        return list(conn.execute(select(UsageRow).order_by(UsageRow.id)).all())


def message(gateway, message_id: int) -> Any:
    with gateway.engine.connect() as conn:
        return conn.execute(select(MessageRow).where(MessageRow.id == message_id)).one()


@pytest.mark.parametrize(("model", "audio_s", "stated_s", "cost", "tokens_in", "shown"), [
    # whisper-1 reports the audio's duration: 90 s at $0.006 a minute (Telegram's 91 s is not used)
    ("whisper-1", 90, 91, 0.009, 0, "$0.0090"),
    # the gpt-4o models report tokens, not seconds: the 90 s the Ogg stream declares (not Telegram's
    # stated 120 s, which the sender sets) at $0.003 a minute
    ("gpt-4o-mini-transcribe", 90, 120, 0.0045, 900, "$0.0045"),
])
async def test_a_voice_notes_transcription_is_a_usage_row_of_its_turn_priced_per_minute(
        model, audio_s, stated_s, cost, tokens_in, shown, tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("Noted: call Ana at five.", usage=CHAT_USAGE)
    fake_openai.script_transcription("Remind me to call Ana at five.")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, llm={"transcription_model": model},
                            agent={"prices": FREE_CHAT, "streaming": []}, web=ADMIN)
    gateway = await start_gateway(config, running)
    chat = 5573001 if model == "whisper-1" else 5573002
    voice = samples.ogg_opus(b"\x11" * 60_000, seconds=audio_s)  # 5 kbit/s (a page holds at most 65,025 bytes)
    fake_telegram.add_file(f"tu-voice-{chat}", voice)

    fake_telegram.inject(voice_update(chat, 1, f"tu-voice-{chat}", len(voice), stated_s))
    await wait_until(lambda: texts(fake_telegram, chat) == ["Noted: call Ana at five."], timeout=15,
                     what="the answer to the voice note")
    assert len(fake_openai.transcriptions) == 1

    rows = usage_rows(gateway)
    [heard] = [r for r in rows if r.model == model]
    [answered] = [r for r in rows if r.model == "gpt-4o-mini"]
    assert heard.cost_usd == pytest.approx(cost, rel=1e-3)  # the Ogg stream's 312 samples of pre-skip off
    assert (heard.provider, heard.platform, heard.user_id, heard.chat_key, heard.turn_id, heard.day) == \
        ("default", "telegram", answered.user_id, answered.chat_key, answered.turn_id, answered.day)
    assert heard.user_id is not None and heard.chat_key.endswith(f":{chat}")
    assert (heard.prompt_tokens, heard.cached_tokens) == (tokens_in, 0)
    assert (heard.completion_tokens > 0) == (tokens_in > 0)  # tokens only where the API reports them
    # keyed by the user message that carries the transcript (written with it, so counted once)
    carrier = message(gateway, int(heard.call_key.removeprefix("message:")))
    assert (carrier.role, carrier.turn_id) == ("user", heard.turn_id)
    assert "Remind me to call Ana at five." in carrier.meta["attachments"][0]["text"]
    [facts] = carrier.meta["transcriptions"]
    assert (facts["model"], facts["seconds"], facts["duration_from"]) == \
        (model, pytest.approx(audio_s, abs=0.01), "api" if model == "whisper-1" else "file")

    fake_telegram.inject(command("/usage", 2, chat))
    await wait_until(lambda: len(texts(fake_telegram, chat)) == 2, timeout=15, what="/usage")
    usage = texts(fake_telegram, chat)[1]
    today = datetime.now(UTC).date().isoformat()
    assert f"Today ({today}): {shown} · {100 + tokens_in} tokens in (0 of them cached), " in usage, usage
    assert "· 2 model calls" in usage, usage
    assert f"• {model} (default): {shown} · {tokens_in} in (0 cached), {heard.completion_tokens} out" in usage, usage

    operator = Operator(f"http://127.0.0.1:{gateway.http_port}")
    try:
        await operator.login()
        _, page, _ = await operator.get("/admin/usage")  # this month by provider and model
        assert re.search(rf"<td>default</td><td><code>{model}</code></td><td>1</td><td>{tokens_in}</td><td>0</td>"
                         rf"<td>{heard.completion_tokens}</td><td>\{shown}</td>", page), page
        _, sessions, _ = await operator.get("/admin/sessions")
        session_id = re.search(r'href="/admin/sessions/([0-9a-f]{32})"', sessions).group(1)
        _, transcript, _ = await operator.get(f"/admin/sessions/{session_id}")
        turn = re.search(r"<h2>Turn .*?<small>(.*?)</small></h2>", transcript, re.DOTALL).group(1)
        assert " ".join(turn.split()).endswith(f"tokens · {shown}"), turn  # the turn's cost includes it
    finally:
        await operator.http.close()


async def test_the_transcription_alone_puts_the_user_over_the_daily_limit_for_the_next_message(
        tmp_path, fake_telegram, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda request: oa.text("Booked.", usage=CHAT_USAGE)
    fake_openai.script_transcription("Book a table for two.")
    config = gateway_config(tmp_path, fake_openai, fake_telegram, llm={"transcription_model": "whisper-1"},
                            agent={"prices": FREE_CHAT, "streaming": []}, limits={"user_daily_usd": 0.005})
    gateway = await start_gateway(config, running)
    chat = 5573003
    voice = samples.ogg_opus(b"\x12" * 3000, seconds=60)  # one minute: $0.0060, over the $0.0050 a day
    fake_telegram.add_file("tu-voice-limit", voice)

    fake_telegram.inject(voice_update(chat, 1, "tu-voice-limit", len(voice), 60))
    await wait_until(lambda: texts(fake_telegram, chat) == ["Booked."], timeout=15, what="the voice note's answer")
    assert len(fake_openai.requests) == 1  # under the limit when it arrived: answered

    fake_telegram.inject(dm_update("and for tomorrow?", 2, user_id=chat))
    await wait_until(lambda: len(texts(fake_telegram, chat)) == 2, timeout=15, what="the limit reply")
    tomorrow = f"{(datetime.now(UTC) + timedelta(days=1)).date().isoformat()} 00:00 UTC"
    assert texts(fake_telegram, chat)[1] == ("💸 You have used today's budget ($0.0060 of $0.0050), so I did not "
                                             f"answer. It resets at {tomorrow}."), texts(fake_telegram, chat)
    assert statuses(gateway, chat) == ["done", "limited"]
    assert len(fake_openai.requests) == 1  # the model was not asked
    assert len(fake_openai.transcriptions) == 1
