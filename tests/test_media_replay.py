"""A voice-note turn run again after a crash does not transcribe again: ``gateway run`` as a
subprocess against the fake Telegram and OpenAI, killed with SIGKILL while the model call is in
flight, then started again. The transcript is stored with the message before the model is called,
so the second run sends the same words to the model and makes no second transcription call, and
the transcription's ``usage`` row, written with that message, is counted once."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from bench.fault_injection import GatewayProcess, _free_port
from gateway.store.models import MessageRow, UsageRow
from tests import media_samples as samples
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

CHAT = 5580001


def config(workdir: Path, telegram: FakeTelegram, model: FakeOpenAI, port: int) -> Path:
    path = workdir / "replay.toml"
    path.write_text(f"""
instance_id = "replay-test"
[database]
url = "sqlite:///{workdir / 'gateway.db'}"
[http]
port = {port}
[llm]
base_url = "{model.url}/v1"
api_key_env = "FAULT_OPENAI_KEY"
max_retries = 0
transcription_model = "whisper-1"
[agent]
streaming = []
[tools]
browser_enabled = false
[media]
directory = "{workdir / 'media'}"
[memory]
promote = false
[bus]
lease_s = 2
sweep_interval_s = 0.3
[telegram]
enabled = true
token_env = "FAULT_TELEGRAM_TOKEN"
base_url = "{telegram.url}"
poll_timeout_s = 1
""")
    return path


def wait(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_a_turn_run_again_after_a_kill_does_not_transcribe_again(tmp_path, fake_telegram, fake_openai):
    fake_openai.reset()
    gate = threading.Event()
    voice = samples.ogg_opus(b"\x05" * 2500, seconds=30)  # whisper-1 reports 30 s: $0.0030
    fake_telegram.add_file("replay-voice", voice)
    fake_openai.script_transcription("Book a table for four at eight.")
    fake_openai.script(oa.hold(gate, oa.text("never delivered")), oa.text("Booked for four at eight."))
    port = _free_port()
    gateway = GatewayProcess(config(tmp_path, fake_telegram, fake_openai, port), port, tmp_path)
    try:
        gateway.start()
        gateway.wait_ready()
        fake_telegram.inject({"message": {
            "message_id": 5, "date": int(time.time()),
            "from": {"id": CHAT, "is_bot": False, "first_name": "Alice"},
            "chat": {"id": CHAT, "type": "private", "first_name": "Alice"},
            "voice": {"file_id": "replay-voice", "file_unique_id": "ureplay", "duration": 30,
                      "mime_type": "audio/ogg", "file_size": len(voice)}}})
        fake_openai.wait_for_requests(1, 20)  # the model call is in flight (held)
        gateway.kill()
        gate.set()

        gateway.start()
        gateway.wait_ready()
        wait(lambda: fake_telegram.sent_messages(CHAT), 20, "the reply after the restart")
        time.sleep(0.5)  # a second reply would show up now
    finally:
        gateway.terminate()

    assert [m["text"] for m in fake_telegram.sent_messages(CHAT)] == ["Booked for four at eight."]
    assert len(fake_openai.transcriptions) == 1  # heard once, across both runs
    first, second = (r["json"]["messages"][-1]["content"] for r in fake_openai.requests[:2])
    assert "Book a table for four at eight." in second
    assert first == second  # the same bytes: the words the model saw are the stored ones

    engine = create_engine(f"sqlite:///{tmp_path / 'gateway.db'}")
    try:
        with engine.connect() as conn:
            [heard] = conn.execute(select(UsageRow).where(UsageRow.model == "whisper-1")).all()  # once, not twice
            [carrier] = conn.execute(select(MessageRow).where(MessageRow.role == "user")).all()
    finally:
        engine.dispose()
    assert heard.cost_usd == pytest.approx(0.003)  # 30 s at $0.006 a minute
    assert heard.call_key == f"message:{carrier.id}"  # written with the message that carries the transcript
    assert (heard.turn_id, heard.platform) == (carrier.turn_id, "telegram") and heard.chat_key.endswith(f":{CHAT}")


def test_a_photo_turn_run_again_after_a_kill_still_sees_the_photo(tmp_path, fake_telegram, fake_openai):
    """The bus starts before the adapters (turns left by the crash resume at once), so the rerun's
    download ran before python-telegram-bot's client existed: the photo was dropped for good
    ("Telegram did not hand over the file"). A download now waits for the adapters to have started
    (and a retryable failure is tried again)."""
    from tests.test_media_telegram_e2e import jpeg, photo_update

    chat = 5580077
    fake_openai.reset()
    gate = threading.Event()
    photo = jpeg(800, 600)
    fake_telegram.add_file("rerun-photo", photo)
    fake_openai.script(oa.hold(gate, oa.text("never delivered")), oa.text("A red rectangle."))
    port = _free_port()
    gateway = GatewayProcess(config(tmp_path, fake_telegram, fake_openai, port), port, tmp_path)
    try:
        gateway.start()
        gateway.wait_ready()
        fake_telegram.inject(photo_update(chat, 7, [("rerun-photo", 800, 600, len(photo))], caption="what is it?"))
        fake_openai.wait_for_requests(1, 20)  # the model call is in flight (held)
        gateway.kill()
        gate.set()
        gateway.start()
        gateway.wait_ready()
        wait(lambda: fake_telegram.sent_messages(chat), 30, "the reply after the restart")
    finally:
        gateway.terminate()
    texts = [m["text"] for m in fake_telegram.sent_messages(chat)]
    assert texts == ["A red rectangle."], texts
    assert oa.image_parts(fake_openai.requests[-1]), "the rerun sent no image"
