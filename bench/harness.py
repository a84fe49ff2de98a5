"""Shared pieces of the benchmark suite: the gateway subprocess in Telegram webhook mode against
the loopback fakes, webhook posting, reply waiting, percentiles and RSS.

The fakes (``tests/fakes``) run in the benchmark's process on their own threads, so their
timestamps (model request arrival, Bot API call arrival) share one clock with the sender.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.config import fakes_config
from bench.fault_injection import TOKEN, GatewayProcess, _free_port
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

SECRET = "bench-webhook-secret-0123"
WEBHOOK_PATH = "/telegram/webhook"
CHAT_BASE = 7_000_000


@dataclass
class Rig:
    """A running gateway subprocess wired to the fakes."""

    telegram: FakeTelegram
    model: FakeOpenAI
    gateway: GatewayProcess

    @property
    def webhook(self) -> str:
        return f"http://127.0.0.1:{self.gateway.port}{WEBHOOK_PATH}"


def write_config(workdir: Path, telegram: FakeTelegram, model: FakeOpenAI, port: int, *, db_url: str,
                 worker_threads: int | None = None, max_turns_in_flight: int | None = None, pool_size: int = 10,
                 history_window: int = 40) -> Path:
    """A webhook-mode gateway config pointed at the fakes (logs at WARNING); the turn pool's keys
    are left at their defaults unless given."""
    pool = {k: v for k, v in (("worker_threads", worker_threads), ("max_turns_in_flight", max_turns_in_flight))
            if v is not None}
    # memory.promote off: the turn path only (memory proposals are one extra, off-path model call per turn)
    return fakes_config(
        workdir / "bench.toml", telegram_fake=telegram, model_fake=model, port=port, db_url=db_url,
        database={"pool_size": pool_size}, agent={**pool, "history_window": history_window},
        tools={"browser_enabled": False}, bus={"sweep_interval_s": 1.0}, memory={"promote": False},
        media={"directory": str(workdir / "media")}, delivery={"backoff_base_s": 0.05})


@contextlib.contextmanager
def rig(workdir: Path, env: dict[str, str] | None = None, python: str | None = None,
        **config: Any) -> Iterator[Rig]:
    """Starts the fakes and one gateway subprocess (fresh SQLite unless ``db_url`` is given;
    ``env``: added to the gateway's environment; ``python``: the interpreter it runs on, default
    this one)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config.setdefault("db_url", f"sqlite:///{workdir / 'gateway.db'}")
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        port = _free_port()
        gateway = GatewayProcess(write_config(workdir, telegram, model, port, **config), port, workdir)
        gateway.env_extra = {"FAULT_WEBHOOK_SECRET": SECRET, **(env or {})}
        gateway.python = python or gateway.python
        gateway.start()
        try:
            gateway.wait_ready(30)
            yield Rig(telegram, model, gateway)
        finally:
            gateway.terminate()


def update(chat: int, message_id: int, text: str) -> dict[str, Any]:
    """A Telegram DM update (``update_id`` unique per chat and message)."""
    user = {"id": chat, "is_bot": False, "first_name": f"U{chat}"}
    return {"update_id": (chat - CHAT_BASE) * 100_000 + message_id,
            "message": {"message_id": message_id, "from": user, "chat": {"id": chat, "type": "private"},
                        "date": int(time.time()), "text": text}}


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    """Posts one webhook (retried like Telegram does on a non-2xx answer)."""
    for _ in range(50):
        async with http.post(url, json=body, headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}) as resp:
            if resp.status == 200:
                return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"webhook kept failing for update {body['update_id']}")


def last_user_line(request: dict[str, Any]) -> str:
    """The newest user message's last line (the token a benchmark sent; the gateway prefixes meta);
    of its text part when it has content parts (an image turn)."""
    content = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
    if isinstance(content, list):
        content = next(p["text"] for p in content if p.get("type") == "text")
    return str(content).splitlines()[-1]


def replies(telegram: FakeTelegram) -> list[Any]:
    """Every ``sendMessage`` call the fake received."""
    return telegram.calls("sendMessage")


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (Linux ``/proc``; threads included)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_per_s(pid: int, seconds: float = 2.0) -> float:
    """Process ``pid``'s CPU seconds per second while nothing is sent to it (heartbeat, sweeper,
    lease keeper), measured over ``seconds``; benchmarks subtract it from their CPU per turn."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


async def wait_for(predicate: Any, timeout: float, poll_s: float = 0.05) -> bool:
    """Polls ``predicate()`` until true or ``timeout``; returns the last result."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(poll_s)
    return bool(predicate())


def positive_int(text: str) -> int:
    """``argparse`` type: a whole number ≥ 1 (``--chats 0`` is a mistake, not an empty run)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative(text: str) -> float:
    """``argparse`` type: a number of seconds (or a count) ≥ 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def positive_rate(text: str) -> float:
    """``argparse`` type: a number > 0 (messages per second)."""
    value = non_negative(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be more than 0")
    return value


def positive_ints(text: str) -> list[int]:
    """``argparse`` type: comma-separated whole numbers ≥ 1 (``--processes 1,2,4``)."""
    return [positive_int(part.strip()) for part in text.split(",")]


@contextlib.contextmanager
def work_folder(keep: str | None, prefix: str) -> Iterator[Path]:
    """The benchmark's work folder: ``keep`` (kept after), or a temporary one removed after the run
    (its database, logs and profiles are only the run's)."""
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        yield Path(folder)
