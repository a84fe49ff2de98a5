"""Deafness after a crash: how soon a gateway killed with SIGKILL and restarted at once (systemd
``Restart=always``) answers Telegram again, with the default leases (``bus.lease_s`` 15 s).

One gateway subprocess in Telegram long-polling mode (it holds the poller lease) against the
loopback fakes. Each run: a DM to chat B is answered (warm), a DM to chat A starts a turn whose
model call hangs (chat A's lane is leased), the process is killed with SIGKILL and started again
at once; from the moment ``/readyz`` answers 200, a new DM goes to chat B (idle) and one to chat A
(busy at the kill). Figures, in seconds after ``/readyz``: ``idle_chat_s`` (chat B's answer: the
poller lease), ``interrupted_turn_s`` (chat A's turn resumed and answered: its lane lease) and
``busy_chat_s`` (chat A's new DM, answered after it).

    .venv/bin/python -m bench.restart --runs 3
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from bench.config import fakes_config
from bench.fault_injection import TOKEN, GatewayProcess, _free_port, _token, _update
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

CHAT_IDLE = 8_100_001
CHAT_BUSY = 8_100_002


def write_config(workdir: Path, telegram: FakeTelegram, model: FakeOpenAI, port: int, *, db_url: str,
                 lease_s: float) -> Path:
    """A polling-mode config with production defaults except the fakes' URLs (and ``lease_s``)."""
    return fakes_config(
        workdir / "restart.toml", telegram_fake=telegram, model_fake=model, port=port, db_url=db_url, mode="polling",
        tools={"browser_enabled": False}, bus={"lease_s": lease_s}, memory={"promote": False},
        logging={"level": "INFO"})


def wait_ready(gateway: GatewayProcess, timeout: float = 60.0) -> float:
    """Polls ``/readyz`` every 20 ms until it answers 200; returns that moment (``time.monotonic``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert gateway.proc is not None
        if gateway.proc.poll() is not None:
            raise RuntimeError(f"gateway exited with {gateway.proc.returncode}; see {gateway.workdir}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{gateway.port}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return time.monotonic()
        except OSError:
            pass
        time.sleep(0.02)
    raise TimeoutError(f"gateway not ready within {timeout} s; see {gateway.workdir}")


class _Replies:
    """When each ``re: TOKEN`` reply first reached the fake Telegram (polled on a thread)."""

    def __init__(self, telegram: FakeTelegram) -> None:
        self.telegram = telegram

    def counts(self) -> Counter[str]:
        return Counter(c.params["text"].removeprefix("re: ") for c in self.telegram.calls("sendMessage"))

    def wait(self, tokens: list[str], timeout: float) -> dict[str, float]:
        """Monotonic arrival time of each token's reply (missing ones left out after ``timeout``)."""
        seen: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while len(seen) < len(tokens) and time.monotonic() < deadline:
            counts = self.counts()
            now = time.monotonic()
            for token in tokens:
                if token not in seen and counts[token]:
                    seen[token] = now
            time.sleep(0.01)
        return seen


def run_restart(workdir: Path, *, runs: int = 3, lease_s: float = 15.0, db_url: str | None = None,
                timeout: float = 60.0) -> dict[str, Any]:
    """Runs ``runs`` kill -9 / restart cycles on one database; returns the figures (seconds after
    ``/readyz``) per run and their maxima. ``timeout`` bounds each wait for a reply."""
    workdir.mkdir(parents=True, exist_ok=True)
    db_url = db_url or f"sqlite:///{workdir / 'gateway.db'}"
    hung: set[str] = set()
    lock = threading.Lock()

    def respond(request: dict[str, Any]) -> oa.Reply:
        token = _token(request)
        with lock:
            first = token.startswith("hang-") and token not in hung
            hung.add(token)
        # The first call for a "hang-" token outlives the process (it is killed meanwhile); the
        # resumed turn's call after the restart is answered at once.
        return oa.delay(3600, oa.text("re: " + token)) if first else oa.text("re: " + token)

    results: list[dict[str, Any]] = []
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        model.responder = respond
        replies = _Replies(telegram)
        port = _free_port()
        gateway = GatewayProcess(write_config(workdir, telegram, model, port, db_url=db_url, lease_s=lease_s),
                                 port, workdir)
        gateway.start()
        try:
            wait_ready(gateway)
            message_id = 100
            for run in range(runs):
                message_id += 10
                warm = f"warm-{run}"
                telegram.inject(_update(warm, CHAT_IDLE, message_id))
                if warm not in replies.wait([warm], timeout):
                    raise TimeoutError(f"run {run}: no answer before the kill; see {workdir}")
                hang = f"hang-{run}"
                asked = len(model.requests)
                telegram.inject(_update(hang, CHAT_BUSY, message_id + 1))
                deadline = time.monotonic() + timeout
                while not any(_token(r["json"]) == hang for r in model.requests[asked:]):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"run {run}: the turn never reached the model; see {workdir}")
                    time.sleep(0.01)
                killed = time.monotonic()
                gateway.kill()
                gateway.start()
                ready = wait_ready(gateway)
                idle, busy = f"idle-{run}", f"busy-{run}"
                telegram.inject(_update(idle, CHAT_IDLE, message_id + 2))
                telegram.inject(_update(busy, CHAT_BUSY, message_id + 3))
                seen = replies.wait([idle, hang, busy], timeout)

                def after(token: str, seen: dict[str, float] = seen, ready: float = ready) -> float | None:
                    return round(seen[token] - ready, 2) if token in seen else None

                results.append({"restart_to_ready_s": round(ready - killed, 2), "idle_chat_s": after(idle),
                                "interrupted_turn_s": after(hang), "busy_chat_s": after(busy)})
        finally:
            gateway.terminate()
        counts = replies.counts()

    def worst(name: str) -> float | None:
        values = [r[name] for r in results]
        return None if any(v is None for v in values) else max(values)

    return {"runs": results, "lease_s": lease_s, "idle_chat_max_s": worst("idle_chat_s"),
            "interrupted_turn_max_s": worst("interrupted_turn_s"), "busy_chat_max_s": worst("busy_chat_s"),
            "duplicated": sorted(t for t, n in counts.items() if n > 1), "workdir": str(workdir)}


def main() -> None:
    parser = argparse.ArgumentParser(description="answer delay after a kill -9 restart (Telegram polling)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lease-s", type=float, default=15.0, help="bus.lease_s (default: the default, 15)")
    parser.add_argument("--db-url", help="database URL (default: a fresh SQLite file)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="gw-restart-"))
    print(json.dumps(run_restart(workdir, runs=args.runs, lease_s=args.lease_s, db_url=args.db_url), indent=2))


if __name__ == "__main__":
    main()
