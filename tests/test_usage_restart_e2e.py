"""Usage is counted once across a crash: the real gateway process, killed with SIGKILL while a turn
waits for its second model call (the first, a tool call, already stored), resumes the turn after
the restart; the ``usage`` table then holds the stored step once and the rerun step once, with
exactly the figures the fake model reported for them."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from bench.fault_injection import TOKEN, GatewayProcess, _free_port, _update
from bench.restart import wait_ready, write_config
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

CHAT = 5572001
TOOL_STEP = oa.usage(1000, 10, cached_tokens=400)
FINAL_STEP = oa.usage(1200, 20, cached_tokens=800)


@pytest.mark.timeout(180)
def test_a_turn_resumed_after_kill_9_counts_each_stored_step_once(tmp_path):
    killed = []

    def respond(request):
        if request["messages"][-1]["role"] != "tool":
            return oa.tool_calls(oa.call("update_plan", {"steps": [{"step": "look it up", "status": "in_progress"}]}),
                                 usage=TOOL_STEP)
        if not killed:  # the process dies while this call waits
            return oa.delay(60, oa.text("never seen", usage=oa.usage(9999, 9999)))
        return oa.text("done", usage=FINAL_STEP)

    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        model.responder = respond
        port = _free_port()
        db = tmp_path / "gateway.db"
        config = write_config(tmp_path, telegram, model, port, db_url=f"sqlite:///{db}", lease_s=2.0)
        gateway = GatewayProcess(config, port, tmp_path)
        gateway.start()
        try:
            wait_ready(gateway)
            telegram.inject(_update("plan something", CHAT, 1))
            deadline = time.monotonic() + 30
            while len(model.requests) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(model.requests) == 2, "the second model call never started"
            gateway.kill()
            killed.append(True)
            gateway.start()
            wait_ready(gateway)
            telegram.wait_for_call_sync("sendMessage", lambda c: int(c.params["chat_id"]) == CHAT
                                        and c.params["text"] == "done", timeout=40)
        finally:
            gateway.terminate()
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT prompt_tokens, cached_tokens, completion_tokens, turn_id FROM usage "
                                 "ORDER BY id")).all()
        assistant = conn.execute(text("SELECT count(*) FROM messages WHERE role = 'assistant'")).scalar_one()
    engine.dispose()
    assert [tuple(r) for r in rows] == [(1000, 400, 10, "in1"), (1200, 800, 20, "in1")]
    assert assistant == 2  # one row per stored step, and one usage row each
    assert len(model.requests) == 3  # the call cut by the kill was made again, and counted once
