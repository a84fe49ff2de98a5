"""A burst of new chats with a slow model: ``chats`` first messages posted at once, each answered
by a model that takes ``latency_s``; beside a floor (``bench.relay``, the same HTTP in and out with
no database, bus or agent loop) measured in the same run.

Figures: seconds from the first post to the last reply (gateway and floor, and their ratio), the
gateway's CPU milliseconds per turn (process CPU time / turns: every turn is the first of its chat,
so it includes the session's creation), its peak RSS while the turns are in flight, and what was
lost or duplicated (counted per chat: exactly one reply each, or the run says which chats differ).
Where the time went: ``model_requests_s`` and ``replies_s``, the first, median and last model
request's arrival at the fake and reply's arrival at Telegram's, in seconds from the first post
(the requests' spread is the work before the model; the replies' beyond it, the work after).

``profile``: a py-spy recording of the gateway during the burst (collapsed stacks) and the top
functions by own and total samples (``bench.profile``).

    python -m bench.burst --chats 200 --latency 2 [--profile]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.fault_injection import ROOT, TOKEN, _free_port
from bench.harness import (
    CHAT_BASE,
    Rig,
    cpu_seconds,
    idle_cpu_per_s,
    last_user_line,
    non_negative,
    positive_int,
    post,
    rig,
    rss_mb,
    update,
    wait_for,
    work_folder,
)
from bench.overhead import _wait_up
from bench.profile import recording
from gateway.delivery.streaming import PREVIEW_SUFFIX
from tests.fakes import openai as oa

TELEGRAM_WEBHOOK_CONNECTIONS = 40
"""Bot API setWebhook ``max_connections`` default: how many webhook requests Telegram has open."""


class _Peak:
    """Samples a process's RSS every ``every_s`` on a thread; ``peak`` is the largest seen (MiB)."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self.pid, self.every_s, self.peak = pid, every_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except OSError:
                return
            self._stop.wait(self.every_s)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def _burst(url: str, r: Rig, tag: str, chats: int, first_chat: int, timeout: float) -> dict[str, Any]:
    """Posts one first message to each of ``chats`` new chats at once; waits for the replies (a
    reply counts once its final text arrived: a ``sendMessage``, or the ``editMessageText`` that
    turns a streamed reply's preview into it; previews end with ``PREVIEW_SUFFIX``)."""
    before, asked_before = len(r.telegram.calls()), len(r.model.requests)
    tokens = {CHAT_BASE + first_chat + c: f"{tag}-{c:05d}" for c in range(chats)}
    started, started_wall = time.monotonic(), time.time()
    # Telegram delivers a bot's webhooks over at most 40 connections at once (setWebhook
    # max_connections, default 40), kept alive.
    connector = aiohttp.TCPConnector(limit=TELEGRAM_WEBHOOK_CONNECTIONS)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(post(http, url, update(chat, 1, token)) for chat, token in tokens.items()))
    posted = time.monotonic() - started
    await wait_for(lambda: len(_finals(r.telegram.calls()[before:])) >= chats, timeout, 0.01)
    await asyncio.sleep(0.5)  # a duplicate would arrive now
    everything = r.telegram.calls()[before:]
    calls = _finals(everything)
    previews = sum(1 for c in everything if c.method == "sendMessage"
                   and str(c.params.get("text", "")).endswith(PREVIEW_SUFFIX))
    got = Counter(c.params["text"].removeprefix("re: ").split("\n", 1)[0] for c in calls)
    expected = set(tokens.values())
    lost = sorted(expected - set(got))
    duplicated = sorted(t for t, n in got.items() if n > 1)
    last = max((c.time for c in calls), default=started)
    asked = sorted(q["time"] - started_wall for q in r.model.requests[asked_before:])
    answered = sorted(c.time - started for c in calls)
    return {"chats": chats, "answered": len(expected & set(got)), "lost": lost, "duplicated": duplicated,
            "seconds": round(last - started, 3), "posting_s": round(posted, 3), "previews": previews,
            "model_requests_s": _spread(asked), "replies_s": _spread(answered)}


def _spread(offsets: list[float]) -> list[float]:
    """Sorted offsets (seconds from the first post) -> ``[first, median, last]``, rounded to ms;
    ``[]`` when there are none. Where a burst's time goes: the model requests' spread is the work
    before the model, the replies' spread past it the work after."""
    if not offsets:
        return []
    return [round(offsets[0], 3), round(offsets[len(offsets) // 2], 3), round(offsets[-1], 3)]


def _finals(calls: list[Any]) -> list[Any]:
    """The calls that delivered a reply's final text (not a streamed preview)."""
    return [c for c in calls if c.method in ("sendMessage", "editMessageText")
            and not str(c.params.get("text", "")).endswith(PREVIEW_SUFFIX)]


def run_burst(workdir: Path, *, chats: int = 200, latency_s: float = 2.0, timeout: float = 120.0,
              profile: bool = False, tokens: int = 0, token_gap_s: float = 0.0, **config: Any) -> dict[str, Any]:
    """One burst through the gateway (default config but for ``config``), then the same burst
    through the relay floor. Returns the figures (``profile``: plus ``bench.profile.summary``).
    ``tokens``: each reply also streams that many more words, one event each, ``token_gap_s``
    apart, after the first (as a model writes); 0: the reply is three events at once."""

    def responder(request: dict[str, Any]) -> oa.Reply:
        text = f"re: {last_user_line(request)}"
        if not tokens:
            return oa.delay(latency_s, oa.text(text, pieces=3))
        words = "".join(f" w{i}" for i in range(tokens))
        return oa.delay(latency_s, oa.text(f"{text}\n{words}", pieces=tokens + 1, piece_delay_s=token_gap_s))

    config.setdefault("pool_size", 20)
    with rig(workdir, **config) as r:
        r.model.responder = responder
        asyncio.run(_burst(r.webhook, r, "warm", 5, 900_000, 30))  # imports, first connections
        pid = r.gateway.proc.pid  # type: ignore[union-attr]
        rss_before = rss_mb(pid)
        record = recording(pid, workdir / "burst.collapsed") if profile else contextlib.nullcontext()
        idle = idle_cpu_per_s(pid)
        cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
        with record, _Peak(pid) as peak:
            gateway = asyncio.run(_burst(r.webhook, r, "gw", chats, 0, timeout))
        # the 0.5 s wait for duplicates inside _burst is counted; the idle rate is subtracted
        cpu = cpu_seconds(pid) - cpu_before - idle * (time.monotonic() - wall_before)
        port = _free_port()
        relay = subprocess.Popen([sys.executable, "-m", "bench.relay", str(port), f"{r.model.url}/v1",
                                  r.telegram.url, TOKEN], cwd=ROOT)
        try:
            asyncio.run(_wait_up(f"http://127.0.0.1:{port}/healthz"))
            url = f"http://127.0.0.1:{port}/telegram/webhook"
            floor = asyncio.run(_burst(url, r, "relay", chats, 500_000, timeout))
        finally:
            relay.terminate()
            relay.wait(10)
    figures = {"chats": chats, "model_latency_s": latency_s, "gateway": gateway, "floor": floor,
               "ratio_to_floor": round(gateway["seconds"] / max(floor["seconds"], 1e-6), 3),
               "gateway_cpu_ms_per_turn": round(1000 * max(cpu, 0.0) / max(1, gateway["answered"]), 2),
               "idle_cpu_ms_per_s": round(1000 * idle, 2), "rss_before_mb": rss_before, "rss_peak_mb": peak.peak,
               "load_1m": round(os.getloadavg()[0], 2)}
    if profile:
        from bench.profile import summary

        figures["profile"] = summary(workdir / "burst.collapsed")
    return figures


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=positive_int, default=200)
    parser.add_argument("--latency", type=non_negative, default=2.0)
    parser.add_argument("--profile", action="store_true", help="record the gateway with py-spy")
    parser.add_argument("--keep", help="keep the work folder here (the log, the profile)")
    parser.add_argument("--tokens", type=lambda text: int(non_negative(text)), default=0,
                        help="each reply streams this many more words, one event each (default: 3 events at once)")
    parser.add_argument("--token-gap", type=non_negative, default=0.0, help="seconds between those events")
    parser.add_argument("--postgres", action="store_true",
                        help="the gateway on a scratch PostgreSQL database (bench.multi_instance.PG_ADMIN_URL)")
    args = parser.parse_args()
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    options: dict[str, Any] = {}
    drop = None
    if args.postgres:
        from bench.multi_instance import scratch_database

        options["db_url"], drop = scratch_database()
    try:
        with work_folder(args.keep, "gw-burst-") as folder:
            print(json.dumps(run_burst(folder, chats=args.chats, latency_s=args.latency, profile=args.profile,
                                       tokens=args.tokens, token_gap_s=args.token_gap, **options), indent=2))
    finally:
        if drop is not None:
            drop()
