"""``event_loop``: ``gateway run`` serves on uvloop by default and on asyncio's loop when asked,
answers a Telegram DM and stops gracefully on SIGTERM on either; ``"uvloop"`` without uvloop
installed is one line and exit 2, before anything is opened (also with ``--workers``)."""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp
import pytest

from bench.harness import CHAT_BASE, last_user_line, post, replies, rig, update
from gateway.app import loops
from gateway.app.cli import main
from gateway.core.errors import ConfigError
from tests.fakes import openai as oa


def test_auto_is_uvloop_where_it_is_installed_and_asyncio_when_chosen() -> None:
    import uvloop  # a dependency of the project on this platform

    name, factory = loops.loop_factory("auto")
    assert name == f"uvloop {uvloop.__version__}" and factory is uvloop.new_event_loop
    assert loops.loop_factory("asyncio") == ("asyncio", asyncio.new_event_loop)
    assert loops.run(_loop_name(), "auto") == "uvloop"
    assert loops.run(_loop_name(), "asyncio") == "asyncio"


def test_without_uvloop_auto_falls_back_and_uvloop_is_refused(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert loops.loop_factory("auto") == ("asyncio", asyncio.new_event_loop)
    with pytest.raises(ConfigError, match='event_loop = "uvloop" but uvloop cannot be imported'):
        loops.loop_factory("uvloop")


def test_run_with_uvloop_chosen_and_missing_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys,
                                                                   keep_logging) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    config = tmp_path / "gateway.toml"
    config.write_text(f'event_loop = "uvloop"\n[database]\nurl = "sqlite:///{tmp_path / "gateway.db"}"\n')
    assert main(["--config", str(config), "run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "uvloop cannot be imported" in err[0], err
    assert not (tmp_path / "gateway.db").exists()  # refused before anything was opened


def test_workers_with_uvloop_chosen_and_missing_is_refused_before_the_supervisor_starts(
        tmp_path, monkeypatch, capsys, keep_logging) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    started = []
    monkeypatch.setattr("gateway.app.workers.Supervisor.run", lambda self: started.append(self) or 0)
    config = tmp_path / "gateway.toml"
    config.write_text('event_loop = "uvloop"\n[database]\nurl = "postgresql+psycopg://gw@127.0.0.1/nowhere"\n')
    assert main(["--config", str(config), "run", "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "uvloop cannot be imported" in err[0], err
    assert started == []


async def _loop_name() -> str:
    return loops.running_loop_name()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("choice", ["auto", "asyncio"])
def test_the_gateway_answers_a_dm_on_the_loop_chosen(choice, tmp_path) -> None:
    expected = "uvloop" if choice == "auto" else "asyncio"
    env = {"GATEWAY__EVENT_LOOP": choice, "GATEWAY__LOGGING__LEVEL": "INFO"}
    with rig(tmp_path, env=env) as r:
        r.model.responder = lambda request: oa.text(f"re: {last_user_line(request)}")
        asyncio.run(_post_one(r.webhook))
        deadline = time.monotonic() + 30
        while not replies(r.telegram) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [call.params["text"] for call in replies(r.telegram)] == ["re: hello over the loop"]
    log = (tmp_path / "bench-0.log").read_text()
    assert f"on the {expected} event loop" in log, log[-2000:]
    # the rig's SIGTERM was a graceful stop on this loop: its handler ran, exit 0, no traceback
    assert r.gateway.proc.returncode == 0, log[-2000:]
    assert "shutting down" in log and "Traceback" not in log, log[-2000:]


async def _post_one(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        await post(http, url, update(CHAT_BASE + 1, 1, "hello over the loop"))
