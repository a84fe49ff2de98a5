"""Fault injection: the gateway as a subprocess, killed with SIGKILL at random points while turns
run, restarted each time; afterwards every inbound message must have exactly one reply.

Run on demand (figures printed as JSON):

    .venv/bin/python -m bench.fault_injection --messages 300 --chats 30

The test suite runs a smaller size (``tests/test_fault_injection.py``). Everything talks to
loopback fakes of the Telegram Bot API and of the model (``tests/fakes``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

from bench.config import fakes_config
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

TOKEN = "7000000001:AAFakeTokenForLoopbackTestsOnly0000"
ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _token(request: dict[str, Any]) -> str:
    user = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
    return user.splitlines()[-1]


def _update(token: str, chat: int, message_id: int) -> dict[str, Any]:
    user = {"id": chat, "is_bot": False, "first_name": f"User{chat}"}
    return {"message": {"message_id": message_id, "from": user, "chat": {"id": chat, "type": "private"},
                        "date": int(time.time()), "text": token}}


def _config(workdir: Path, telegram: FakeTelegram, model: FakeOpenAI, port: int, db_url: str) -> Path:
    return fakes_config(
        workdir / "gateway.toml", telegram_fake=telegram, model_fake=model, port=port, db_url=db_url, mode="polling",
        # kills at random moments, not caused by a turn: a turn in flight at several of them is
        # still answered (bus.max_turn_crashes would rightly give it up in production)
        bus={"lease_s": 1.5, "sweep_interval_s": 0.3, "max_turn_crashes": 1000},
        delivery={"backoff_base_s": 0.05, "claim_s": 2},
        telegram={"poll_timeout_s": 1})


def _unconfirmed(db_url: str) -> set[str]:
    """Tokens whose reply row ended ``unconfirmed`` (a part in flight at a kill, not resent)."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT text FROM outbox WHERE status = 'unconfirmed'")).scalars().all()
    except Exception:
        return set()
    finally:
        engine.dispose()
    return {t.removeprefix("re: ") for t in rows}


class GatewayProcess:
    """``python -m gateway run`` in a subprocess, with its log in ``workdir``."""

    def __init__(self, config: Path, port: int, workdir: Path) -> None:
        self.config, self.port, self.workdir = config, port, workdir
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.env_extra: dict[str, str] = {}
        self.python = sys.executable
        """The interpreter the gateway runs on (a virtualenv's ``bin/python`` with the project installed)."""

    def start(self) -> None:
        env = {**os.environ, "FAULT_OPENAI_KEY": "sk-test", "FAULT_TELEGRAM_TOKEN": TOKEN,
               "NO_PROXY": "127.0.0.1,localhost", "PYTHONPATH": str(ROOT), **self.env_extra}
        log = open(self.workdir / f"{self.config.stem}-{self.starts}.log", "wb")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen([self.python, "-m", "gateway", "--config", str(self.config), "run"],
                                     cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1

    def wait_ready(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}; see {self.workdir}")
            try:
                # /readyz: 200 once every adapter has started (webhooks get 503 before that)
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("gateway did not become ready")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


def run_fault_injection(*, messages: int = 60, chats: int = 20, kill_interval: tuple[float, float] = (0.3, 1.2),
                        model_delay: tuple[float, float] = (0.02, 0.15), inject_every: float = 0.1, seed: int = 7,
                        db_url: str | None = None, workdir: Path | None = None, settle_s: float = 60) -> dict[str, Any]:
    """Runs the experiment; returns figures: turns, kills, lost, duplicated, unconfirmed, seconds."""
    rng = random.Random(seed)
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gw-fault-"))
    db_url = db_url or f"sqlite:///{workdir / 'gateway.db'}"
    started = time.monotonic()
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        model.responder = lambda req: oa.delay(rng.uniform(*model_delay), oa.text(f"re: {_token(req)}"))
        port = _free_port()
        gateway = GatewayProcess(_config(workdir, telegram, model, port, db_url), port, workdir)
        tokens = [f"msg-{i:04d}" for i in range(messages)]
        plan = [(token, 6_000_000 + i % chats, 100 + i) for i, token in enumerate(tokens)]
        kills = 0
        gateway.start()
        gateway.wait_ready()
        next_kill = time.monotonic() + rng.uniform(*kill_interval)
        next_inject = time.monotonic()
        injected = 0
        deadline = None

        def replies() -> Counter[str]:
            return Counter(c.params["text"].removeprefix("re: ") for c in telegram.calls("sendMessage"))

        while True:
            now = time.monotonic()
            if injected < len(plan) and now >= next_inject:
                token, chat, message_id = plan[injected]
                telegram.inject(_update(token, chat, message_id))
                injected += 1
                next_inject = now + rng.uniform(0, 2 * inject_every)
                if injected == len(plan):
                    deadline = now + settle_s
            if now >= next_kill and injected < len(plan) + 1 and (deadline is None or now < deadline - settle_s / 2):
                gateway.kill()
                kills += 1
                gateway.start()
                gateway.wait_ready()
                next_kill = time.monotonic() + rng.uniform(*kill_interval)
            if injected == len(plan):
                counts, unconfirmed = replies(), _unconfirmed(db_url)
                if all(counts[t] >= 1 or t in unconfirmed for t in tokens) or now > deadline:
                    break
            time.sleep(0.02)
        time.sleep(1.0)  # anything late (a duplicate) would show up now
        gateway.terminate()
        counts = replies()

    unconfirmed = _unconfirmed(db_url)
    engine = create_engine(db_url)
    with engine.connect() as conn:
        inbox_rows = conn.execute(text("SELECT count(*) FROM inbox")).scalar_one()
    engine.dispose()
    lost = [t for t in tokens if counts[t] == 0 and t not in unconfirmed]
    duplicated = [t for t in tokens if counts[t] > 1]
    return {
        "messages": messages, "chats": chats, "kills": kills, "process_starts": gateway.starts,
        "inbox_rows": inbox_rows, "replied_once": sum(1 for t in tokens if counts[t] == 1),
        "lost": len(lost), "duplicated": len(duplicated), "unconfirmed_not_resent": len(unconfirmed),
        "unconfirmed_delivered": sum(1 for t in unconfirmed if counts[t] == 1),
        "lost_ids": lost[:10], "duplicated_ids": duplicated[:10],
        "seconds": round(time.monotonic() - started, 1), "workdir": str(workdir),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="kill -9 fault injection against the gateway")
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--chats", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--db-url", help="database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    figures = run_fault_injection(messages=args.messages, chats=args.chats, seed=args.seed, db_url=args.db_url)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
