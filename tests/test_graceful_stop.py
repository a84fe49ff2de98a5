"""SIGTERM with ten turns in flight, end to end: ``gateway run`` as a subprocess polling the fake
Telegram (python-telegram-bot) with a fake model that holds every call until the test lets it go.

1. Stop timeout long enough: the model answers after the stop began (``/readyz`` is no longer
   200); every reply is sent before the process exits, once, through a Bot API client still open.
2. Stop timeout shorter than the model: the process exits at the timeout without those replies;
   after the restart every one of them is sent exactly once (and none of round 1 again).
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench.fault_injection import TOKEN, GatewayProcess, _free_port
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

TURNS = 10
CHAT_BASE = 6_100_000


def config(workdir: Path, telegram: FakeTelegram, model: FakeOpenAI, port: int) -> Path:
    path = workdir / "stop.toml"
    path.write_text(f"""
instance_id = "stop-test"
[database]
url = "sqlite:///{workdir / 'gateway.db'}"
[http]
port = {port}
[llm]
base_url = "{model.url}/v1"
api_key_env = "FAULT_OPENAI_KEY"
max_retries = 0
[agent]
streaming = []
[tools]
browser_enabled = false
[memory]
promote = false
[bus]
lease_s = 2
sweep_interval_s = 0.3
[delivery]
backoff_base_s = 0.05
[telegram]
enabled = true
token_env = "FAULT_TELEGRAM_TOKEN"
base_url = "{telegram.url}"
poll_timeout_s = 1
[logging]
level = "INFO"
""")
    return path


def token_of(request: dict[str, Any]) -> str:
    user = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
    return user.splitlines()[-1]


def dm(token: str, chat: int, message_id: int) -> dict[str, Any]:
    user = {"id": chat, "is_bot": False, "first_name": f"User{chat}"}
    return {"message": {"message_id": message_id, "from": user, "chat": {"id": chat, "type": "private"},
                        "date": int(time.time()), "text": token}}


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def held(model: FakeOpenAI) -> int:
    """Model calls that arrived and are not answered yet."""
    return sum(1 for r in model.requests if r["status"] is None)


@pytest.mark.timeout(300)
def test_sigterm_with_ten_turns_in_flight_delivers_each_reply_exactly_once(tmp_path):
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        def replies() -> Counter[str]:
            return Counter(c.params["text"] for c in telegram.calls("sendMessage"))

        port = _free_port()
        gateway = GatewayProcess(config(tmp_path, telegram, model, port), port, tmp_path)

        def sigterm_with_turns_in_flight(round_: str, gate: threading.Event, stop_timeout_s: float) -> None:
            model.responder = lambda req: oa.hold(gate, oa.text(f"re: {token_of(req)}"))
            gateway.env_extra = {"GATEWAY__STOP_TIMEOUT_S": str(stop_timeout_s)}
            gateway.start()
            gateway.wait_ready(60)
            for i in range(TURNS):
                telegram.inject(dm(f"{round_}-{i}", CHAT_BASE + i, message_id=gateway.starts))
            wait(lambda: held(model) == TURNS, 60, f"{TURNS} model calls in flight")
            assert gateway.proc is not None
            gateway.proc.send_signal(signal.SIGTERM)
            wait(lambda: not ready(port), 30, "/readyz to leave 200 (the stop began)")

        try:
            # 1. The model answers while the gateway stops: every reply goes out before the exit.
            first = threading.Event()
            sigterm_with_turns_in_flight("a", first, stop_timeout_s=60)
            first.set()
            assert gateway.proc is not None and gateway.proc.wait(90) == 0
            sent = replies()
            assert [sent[f"re: a-{i}"] for i in range(TURNS)] == [1] * TURNS, sent
            log = (tmp_path / "stop-0.log").read_text()
            assert "not initialized" not in log and "Traceback" not in log, log[-3000:]

            # 2. The model is slower than the stop timeout: the process exits without waiting for it.
            second = threading.Event()
            sigterm_with_turns_in_flight("b", second, stop_timeout_s=1)
            assert gateway.proc.wait(60) == 0, "the stop timeout did not bound the stop"
            assert not any(text.startswith("re: b-") for text in replies()), replies()
            assert "resume after the restart" in (tmp_path / "stop-1.log").read_text()

            # The restart runs the cut turns again: each reply exactly once, nothing of round 1 again.
            model.responder = lambda req: oa.text(f"re: {token_of(req)}")
            second.set()  # the cut process's calls, answered to nobody
            gateway.env_extra = {}
            gateway.start()
            gateway.wait_ready(60)
            wait(lambda: all(replies()[f"re: b-{i}"] for i in range(TURNS)), 60, "the cut turns' replies")
            time.sleep(1.0)  # a duplicate would show up now
        finally:
            gateway.terminate()
        sent = replies()
        assert {text: count for text, count in sent.items() if count != 1} == {}
        assert sorted(sent) == sorted([f"re: a-{i}" for i in range(TURNS)] + [f"re: b-{i}" for i in range(TURNS)])
