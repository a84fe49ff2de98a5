"""(a) Gateway overhead per turn at a fixed message rate, beside a floor (a bare relay).

Overhead = (model request arrival - webhook post) + (Bot API ``sendMessage`` arrival - model
reply), with an instant fake model: everything the gateway adds on the way in and on the way
out (dedupe/inbox write, lane lease, session load, transcript and outbox writes, delivery). The
floor is the same HTTP in/out through ``bench.relay`` (no database), measured in the same run.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.fault_injection import ROOT, TOKEN, _free_port
from bench.harness import CHAT_BASE, Rig, last_user_line, ms, percentile, post, rig, update, wait_for
from tests.fakes import openai as oa

_MESSAGE_IDS = itertools.count(10_000)


class _Stamps:
    """Model reply times by token (the responder runs when the fake answers)."""

    def __init__(self) -> None:
        self.replied: dict[str, float] = {}

    def responder(self, request: dict[str, Any]) -> oa.TextReply:
        token = last_user_line(request)
        self.replied[token] = time.time()
        return oa.text(f"re: {token}", pieces=1)


async def _drive(url: str, rig_: Rig, tag: str, messages: int, rate: float, chats: int,
                 stamps: _Stamps, timeout: float) -> dict[str, Any]:
    """Posts ``messages`` at ``rate``/s round-robin over ``chats`` DMs; returns the latency figures."""
    posted: dict[str, float] = {}
    start_ids = len(rig_.model.requests), len(rig_.telegram.calls("sendMessage"))
    async with aiohttp.ClientSession() as http:
        tasks = []
        start = time.monotonic()
        for i in range(messages):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            token = f"{tag}-{i:05d}"
            posted[token] = time.time()
            body = update(CHAT_BASE + i % chats, next(_MESSAGE_IDS), token)
            tasks.append(asyncio.create_task(post(http, url, body)))
        await asyncio.gather(*tasks)
        done = await wait_for(lambda: len(rig_.telegram.calls("sendMessage")) - start_ids[1] >= messages, timeout)
    mono_to_wall = time.time() - time.monotonic()
    arrived = {last_user_line(r["json"]): r["time"] for r in rig_.model.requests[start_ids[0]:]}
    sent = {c.params["text"].removeprefix("re: "): c.time + mono_to_wall
            for c in rig_.telegram.calls("sendMessage")[start_ids[1]:]}
    inbound, outbound, total = [], [], []
    for token, t0 in posted.items():
        if token in arrived and token in sent and token in stamps.replied:
            inbound.append(arrived[token] - t0)
            outbound.append(sent[token] - stamps.replied[token])
            total.append(inbound[-1] + outbound[-1])

    def summary(values: list[float]) -> dict[str, float]:
        return {"p50_ms": ms(percentile(values, 0.5)), "p99_ms": ms(percentile(values, 0.99))}

    return {"completed": len(total), "all_replied": done, "inbound_to_model": summary(inbound),
            "model_to_platform": summary(outbound), "overhead": summary(total)}


def run_overhead(workdir: Path, *, messages: int = 1000, rate: float = 50.0, chats: int = 50,
                 warmup: int = 20) -> dict[str, Any]:
    """Runs gateway and floor at the same rate; returns both and the difference at p50/p99."""
    stamps = _Stamps()
    with rig(workdir) as r:
        r.model.responder = stamps.responder
        asyncio.run(_drive(r.webhook, r, "warm", warmup, rate, chats, stamps, 30))
        gateway = asyncio.run(_drive(r.webhook, r, "gw", messages, rate, chats, stamps, 60 + messages / rate))
        port = _free_port()
        relay = subprocess.Popen([sys.executable, "-m", "bench.relay", str(port), f"{r.model.url}/v1",
                                  r.telegram.url, TOKEN], cwd=ROOT)
        try:
            url = f"http://127.0.0.1:{port}/telegram/webhook"
            asyncio.run(_wait_up(f"http://127.0.0.1:{port}/healthz"))
            asyncio.run(_drive(url, r, "rwarm", warmup, rate, chats, stamps, 30))
            floor = asyncio.run(_drive(url, r, "relay", messages, rate, chats, stamps, 60 + messages / rate))
        finally:
            relay.terminate()
            relay.wait(10)
    return {"rate_per_s": rate, "messages": messages, "chats": chats, "gateway": gateway, "floor": floor,
            "added_by_gateway_ms": {q: round(gateway["overhead"][q] - floor["overhead"][q], 2)
                                    for q in ("p50_ms", "p99_ms")}}


async def _wait_up(url: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} did not come up")
