"""Graceful stop, end to end against the fake Telegram (python-telegram-bot) and a fake model
that holds calls until the test lets them go.

SIGTERM with ten turns in flight (``gateway run`` as a subprocess):
1. Stop timeout long enough: the model answers after the stop began (``/readyz`` is no longer
   200); every reply is sent before the process exits, once, through a Bot API client still open.
2. Stop timeout shorter than the model: the process exits at the timeout without those replies;
   after the restart every one of them is sent exactly once (and none of round 1 again).

``Gateway.stop`` during a turn's tool step: the step finishes (the tool runs, its result is
stored), the turn stops before its next model call, and the next start resumes it from the
transcript without running the tool again.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from bench.fault_injection import TOKEN, GatewayProcess, _free_port
from gateway.app.gateway import Gateway
from gateway.app.wiring import build_adapters
from gateway.store.models import InboxRow, MessageRow
from tests.conftest import fixture, gateway_config
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


def dm_asking(chat: int, message_id: int, text: str) -> dict[str, Any]:
    """A Telegram DM update (no update id: the fake numbers it) from user ``chat``."""
    update = fixture("telegram", "dm_text.json")
    update.pop("update_id")
    update["message"]["from"]["id"] = update["message"]["chat"]["id"] = chat
    update["message"].update(message_id=message_id, text=text)
    return update


def codename_model(model: FakeOpenAI, page_server: Any) -> tuple[threading.Event, Any]:
    """The model's first answer (held until the returned gate is set) fetches the page; later ones
    answer its codename when the fetched page is in the request. Returns the gate and the call."""
    model.reset()
    gate = threading.Event()
    fetch = oa.call("web_fetch", {"url": f"{page_server.url}/page"})
    model.script(oa.hold(gate, oa.tool_calls(fetch)))
    model.responder = lambda req: oa.text(
        "codename amber-falcon-42" if "amber-falcon-42" in str(req["messages"][-1]["content"]) else "no tool result")
    return gate, fetch


async def stop_during_the_tool_step(config: Any, telegram: FakeTelegram, model: FakeOpenAI,
                                    update: dict[str, Any], gate: threading.Event) -> Gateway:
    """Starts a gateway, sends ``update``, begins a graceful stop while the model's first call (held
    by ``gate``) is in flight, then lets it answer: its tool step runs during the stop and the turn
    stops before its next model call. Returns the stopped gateway."""
    gateway = Gateway(config, build_adapters(config))
    await gateway.start()
    telegram.inject(update)
    await asyncio.to_thread(model.wait_for_requests, 1, 10)
    stopping = asyncio.create_task(gateway.stop())
    while gateway.started:
        await asyncio.sleep(0.01)
    gate.set()  # the model answers the step in flight: a tool call, run during the stop
    await asyncio.wait_for(stopping, 30)
    return gateway


async def first_reply(telegram: FakeTelegram, chat: int) -> None:
    """Waits (at most 20 s) for a reply to ``chat``, then half a second more (a second would show)."""
    deadline = time.monotonic() + 20
    while not telegram.sent_messages(chat) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)


async def test_stop_lets_the_tool_step_finish_and_the_turn_resume_after_the_restart(
        tmp_path, fake_telegram, fake_openai, page_server):
    gate, fetch = codename_model(fake_openai, page_server)
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"streaming": []})
    chat = 5552001
    update = dm_asking(chat, 77, "what is the codename on that page?")

    first = await stop_during_the_tool_step(config, fake_telegram, fake_openai, update, gate)
    assert len(fake_openai.requests) == 1  # no further model call after the stop began
    assert not fake_telegram.sent_messages(chat)
    assert first.unfinished_turns == 0  # the step ended within the stop timeout

    second = Gateway(config, build_adapters(config))
    await second.start()
    try:
        await first_reply(fake_telegram, chat)
        assert [m["text"] for m in fake_telegram.sent_messages(chat)] == ["codename amber-falcon-42"]
        resumed = fake_openai.requests[1]["json"]["messages"]
        assert [m["role"] for m in resumed] == ["system", "user", "assistant", "tool"]
        assert resumed[-1]["tool_call_id"] == fetch.id and len(fake_openai.requests) == 2
        with second.engine.connect() as conn:
            roles = conn.execute(select(MessageRow.role).order_by(MessageRow.id)).scalars().all()
            inbox = conn.execute(select(InboxRow.status)).scalars().all()
        assert roles == ["user", "assistant", "tool", "assistant"] and inbox == ["done"]
    finally:
        await second.stop()


async def test_a_turn_resumed_after_a_restart_is_not_moved_to_a_new_conversation_by_the_idle_reset(
        tmp_path, fake_telegram, fake_openai, page_server):
    """The gateway was down longer than ``sessions.idle_reset_minutes`` while a turn had run a tool
    step: the resumed turn went to a new conversation (the reset), with its user message again and
    its tool run a second time, and its answer began with the reset notice. A turn already begun
    finishes in its own conversation."""
    gate, _ = codename_model(fake_openai, page_server)
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"streaming": []},
                            sessions={"idle_reset_minutes": 0.02})  # 1.2 s
    chat = 5552011
    await stop_during_the_tool_step(config, fake_telegram, fake_openai,
                                    dm_asking(chat, 78, "what is the codename on that page?"), gate)
    await asyncio.sleep(1.5)  # down longer than the idle reset

    second = Gateway(config, build_adapters(config))
    await second.start()
    try:
        await first_reply(fake_telegram, chat)
        assert [m["text"] for m in fake_telegram.sent_messages(chat)] == ["codename amber-falcon-42"]
        resumed = fake_openai.requests[1]["json"]["messages"]
        assert [m["role"] for m in resumed] == ["system", "user", "assistant", "tool"]
        with second.engine.connect() as conn:
            sessions = conn.execute(select(MessageRow.session_id).distinct()).scalars().all()
            roles = conn.execute(select(MessageRow.role).order_by(MessageRow.id)).scalars().all()
        assert len(sessions) == 1 and roles == ["user", "assistant", "tool", "assistant"]
    finally:
        await second.stop()


@pytest.mark.timeout(180)
def test_sighup_from_a_closed_terminal_stops_as_gracefully_as_sigterm(tmp_path):
    """Closing the terminal ``gateway run`` was started from sends SIGHUP: the turn in flight
    finishes and its reply goes out once before the exit (status 0), as with SIGTERM."""
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        port = _free_port()
        gateway = GatewayProcess(config(tmp_path, telegram, model, port), port, tmp_path)
        gate = threading.Event()
        model.responder = lambda req: oa.hold(gate, oa.text(f"re: {token_of(req)}"))
        gateway.start()
        try:
            gateway.wait_ready(60)
            telegram.inject(dm("hup-0", CHAT_BASE, message_id=1))
            wait(lambda: held(model) == 1, 60, "the model call in flight")
            assert gateway.proc is not None
            gateway.proc.send_signal(signal.SIGHUP)
            wait(lambda: not ready(port), 30, "/readyz to leave 200 (the stop began)")
            gate.set()
            assert gateway.proc.wait(60) == 0
        finally:
            gate.set()
            gateway.terminate()
        assert [c.params["text"] for c in telegram.calls("sendMessage")] == ["re: hup-0"]


async def test_a_turn_resumed_after_a_restart_keeps_what_it_spent_of_its_budget(
        tmp_path, fake_telegram, fake_openai, page_server):
    """A resumed turn started with a fresh budget (90 calls, $1, per task), so each restart gave the
    same task its budget again (found by a review). Its stored calls now count: with two calls
    allowed and one made before the stop, the resumed turn makes one more and says why it stopped."""
    fake_openai.reset()
    gate = threading.Event()
    fetch = oa.call("web_fetch", {"url": f"{page_server.url}/page"})
    fake_openai.script(oa.hold(gate, oa.tool_calls(fetch)))
    fake_openai.responder = lambda req: oa.tool_calls(oa.call("web_fetch", {"url": f"{page_server.url}/page"}))
    config = gateway_config(tmp_path, fake_openai, fake_telegram, agent={"streaming": [], "iteration_budget": 2})
    chat = 5552003
    await stop_during_the_tool_step(config, fake_telegram, fake_openai,
                                    dm_asking(chat, 79, "keep fetching that page"), gate)
    assert len(fake_openai.requests) == 1

    second = Gateway(config, build_adapters(config))
    await second.start()
    try:
        await first_reply(fake_telegram, chat)
        assert len(fake_openai.requests) == 2  # one more call, not two
        [reply] = [m["text"] for m in fake_telegram.sent_messages(chat)]
        assert "I reached the iteration budget (2 model calls) for this task" in reply, reply
    finally:
        await second.stop()
