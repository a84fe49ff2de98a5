"""(b) Throughput and completion with many concurrent conversations and a slow model.

Each of ``conversations`` DMs sends ``rounds`` messages, each after the previous reply (a closed
loop). With a model latency of ``L`` s and every conversation in flight at once, the ceiling
is conversations / L turns per second; the figure is how close the gateway gets.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness import CHAT_BASE, Rig, cpu_seconds, last_user_line, percentile, post, rig, update, wait_for
from tests.fakes import openai as oa


async def _closed_loop(r: Rig, conversations: int, rounds: int, timeout: float) -> tuple[float, int, list[float]]:
    """Runs the conversations; returns (seconds, replies, per-turn latencies)."""
    latencies: list[float] = []
    counts: Counter[int] = Counter()
    seen = [0]

    def absorb() -> None:
        calls = r.telegram.calls("sendMessage")
        for call in calls[seen[0]:]:
            counts[int(call.params["chat_id"])] += 1
        seen[0] = len(calls)

    async def conversation(http: aiohttp.ClientSession, chat: int) -> None:
        for index in range(rounds):
            sent = time.monotonic()
            await post(http, r.webhook, update(chat, 1 + index, f"c{chat} r{index}"))
            if not await wait_for(lambda i=index: counts[chat] > i, deadline - time.monotonic(), 0.02):
                return
            latencies.append(time.monotonic() - sent)

    async def collector() -> None:
        while True:
            absorb()
            await asyncio.sleep(0.01)

    started = time.monotonic()
    deadline = started + timeout
    task = asyncio.create_task(collector())
    connector = aiohttp.TCPConnector(limit=conversations)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(conversation(http, CHAT_BASE + c) for c in range(conversations)))
    task.cancel()
    absorb()
    return time.monotonic() - started, sum(counts.values()), latencies


def run_throughput(workdir: Path, *, conversations: int = 100, rounds: int = 3, latency_s: float = 2.0,
                   timeout: float = 120.0, postgres: bool = False) -> dict[str, Any]:
    """One closed-loop run; figures: turns/s vs ceiling, completion, turn latency p50/p99, the
    gateway's CPU per turn. ``postgres``: a scratch PostgreSQL database instead of SQLite."""
    if postgres:
        from bench.multi_instance import scratch_database

        db_url, drop = scratch_database()
        try:
            return {"database": "postgresql", **_run(workdir, conversations, rounds, latency_s, timeout, db_url)}
        finally:
            drop()
    return {"database": "sqlite", **_run(workdir, conversations, rounds, latency_s, timeout, None)}


def _run(workdir: Path, conversations: int, rounds: int, latency_s: float, timeout: float,
         db_url: str | None) -> dict[str, Any]:
    # PostgreSQL: pool_size + overflow connections each; stay well below max_connections (100).
    extra = {"db_url": db_url, "pool_size": 20} if db_url else {"pool_size": 50}
    with rig(workdir, max_turns_in_flight=max(512, conversations), **extra) as r:
        r.model.responder = lambda req: oa.delay(latency_s, oa.text(f"re: {last_user_line(req)}", pieces=1))
        pid = r.gateway.proc.pid  # type: ignore[union-attr]
        cpu_before = cpu_seconds(pid)
        seconds, replied, latencies = asyncio.run(_closed_loop(r, conversations, rounds, timeout))
        cpu = cpu_seconds(pid) - cpu_before
    expected = conversations * rounds
    ceiling = conversations / latency_s
    throughput = replied / seconds
    return {"conversations": conversations, "rounds": rounds, "model_latency_s": latency_s,
            "turns": expected, "replied": replied, "completion": round(replied / expected, 4),
            "seconds": round(seconds, 2), "turns_per_s": round(throughput, 1), "ceiling_turns_per_s": ceiling,
            "of_ceiling": round(throughput / ceiling, 3),
            "gateway_cpu_ms_per_turn": round(1000 * cpu / max(1, replied), 1),
            "gateway_cpu_share": round(cpu / seconds, 2),
            "turn_latency_p50_s": round(percentile(latencies, 0.5), 3),
            "turn_latency_p99_s": round(percentile(latencies, 0.99), 3)}
