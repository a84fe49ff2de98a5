"""The real gateway process, killed with SIGKILL and started again at once, answers Telegram within
seconds of ``/readyz`` (not after the dead process's 15 s leases); a second live process with the
same instance id is refused with one line and exit code 2, while one with its own id runs beside it."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, text

from bench.fault_injection import ROOT, TOKEN, GatewayProcess, _free_port, _update
from bench.restart import CHAT_IDLE, run_restart, wait_ready, write_config
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

ANSWER_WITHIN_S = 5.0
"""A third of the 15 s lease: a restart that waits the lease out cannot pass, a loaded machine can."""


@pytest.mark.timeout(180)
def test_a_dm_after_kill_9_and_restart_is_answered_within_seconds_of_ready(tmp_path):
    figures = run_restart(tmp_path, runs=1, lease_s=15.0, timeout=40)
    print("restart:", figures)
    [run] = figures["runs"]
    assert run["idle_chat_s"] is not None and run["idle_chat_s"] < ANSWER_WITHIN_S, figures  # poller lease
    assert run["interrupted_turn_s"] is not None and run["interrupted_turn_s"] < ANSWER_WITHIN_S, figures  # lane
    assert run["busy_chat_s"] is not None and run["busy_chat_s"] < ANSWER_WITHIN_S, figures
    assert figures["duplicated"] == [], figures
    # The last stop was a SIGTERM: the id and every lease it held were given up.
    engine = create_engine(f"sqlite:///{tmp_path / 'gateway.db'}")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM instances")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM lanes WHERE lease_owner IS NOT NULL")).scalar_one() == 0
    engine.dispose()


@pytest.mark.timeout(180)
def test_a_second_live_process_with_the_same_id_is_refused_with_one_line_and_exit_2(tmp_path):
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        model.responder = lambda req: oa.text("still here")
        port = _free_port()
        config = write_config(tmp_path, telegram, model, port, db_url=f"sqlite:///{tmp_path / 'gateway.db'}",
                              lease_s=15.0)
        first = GatewayProcess(config, port, tmp_path)
        first.start()
        try:
            wait_ready(first)
            env = {**first_env(), "GATEWAY__HTTP__PORT": str(_free_port()), "GATEWAY__LOGGING__LEVEL": "WARNING"}
            started = time.monotonic()
            twin = subprocess.run([sys.executable, "-m", "gateway", "--config", str(config), "run"], cwd=tmp_path,
                                  env=env, capture_output=True, text=True, timeout=30)
            lines = (twin.stdout + twin.stderr).strip().splitlines()
            print("twin:", lines)
            assert twin.returncode == 2, lines
            assert len(lines) == 1, lines
            assert lines[0].startswith("error: instance id '") and f"is in use by pid {first.proc.pid} on " in lines[0]
            assert "GATEWAY__INSTANCE_ID" in lines[0]
            assert time.monotonic() - started < 30  # refused at once (the pid is alive), not after a lease
            # The first process never noticed: it still answers.
            telegram.inject(_update("hello", CHAT_IDLE, 1))
            telegram.wait_for_call_sync("sendMessage", lambda c: c.params["text"] == "still here", timeout=20)
            # Its own id: a second process on this host and database runs beside the first.
            other = GatewayProcess(config, _free_port(), tmp_path)
            other.env_extra = {"GATEWAY__HTTP__PORT": str(other.port), "GATEWAY__INSTANCE_ID": "second"}
            other.start()
            try:
                wait_ready(other)
            finally:
                other.terminate()
            assert other.proc.returncode == 0
        finally:
            first.terminate()


def first_env() -> dict[str, str]:
    """The environment ``GatewayProcess`` gives the gateway (secrets of the fakes)."""
    import os

    return {**os.environ, "FAULT_OPENAI_KEY": "sk-test", "FAULT_TELEGRAM_TOKEN": TOKEN,
            "NO_PROXY": "127.0.0.1,localhost", "PYTHONPATH": str(ROOT)}
