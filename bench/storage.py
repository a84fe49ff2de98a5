"""(c) RSS with many stored and active sessions; (f) session load time vs transcript length.

Stored sessions are written straight through ``Store`` into the database before the gateway
starts (as if they had been used earlier); active sessions are conversations with a turn in
flight (a slow model keeps them active while RSS is sampled).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness import CHAT_BASE, last_user_line, post, rig, rss_mb, update, wait_for
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import NewMessage, Store
from tests.fakes import openai as oa

SYSTEM = "You are a helpful assistant that lives in team chats."


def _seed(store: Store, sessions: int, messages_each: int) -> None:
    """Creates ``sessions`` stored sessions of ``messages_each`` transcript messages."""
    for s in range(sessions):
        opened = store.open_session(f"telegram:bench:dm:{9_000_000 + s}", lambda: SYSTEM, 1)
        store.append_messages(opened.session_id, [
            NewMessage(f"seed{s}-{i // 2}", "user" if i % 2 == 0 else "assistant", f"stored message {i} " * 8, {})
            for i in range(messages_each)])


def run_rss(workdir: Path, *, stored: int = 10_000, active: int = 500, latency_s: float = 3.0) -> dict[str, Any]:
    """RSS of the gateway process idle with ``stored`` sessions, then with ``active`` turns in flight."""
    db_url = f"sqlite:///{workdir / 'gateway.db'}"
    engine = create_db_engine(db_url)
    upgrade(engine)
    started = time.monotonic()
    _seed(Store(engine), stored, 4)
    engine.dispose()
    seed_s = time.monotonic() - started
    with rig(workdir, db_url=db_url, max_turns_in_flight=max(512, active), pool_size=50) as r:
        pid = r.gateway.proc.pid  # type: ignore[union-attr]
        time.sleep(0.5)
        idle = rss_mb(pid)
        r.model.responder = lambda req: oa.delay(latency_s, oa.text(f"re: {last_user_line(req)}", pieces=1))
        peak = asyncio.run(_active(r, active, latency_s, pid))
        after = rss_mb(pid)
    return {"stored_sessions": stored, "active_sessions": active, "seed_seconds": round(seed_s, 1),
            "rss_idle_mb": idle, "rss_active_peak_mb": peak, "rss_after_mb": after}


async def _active(r: Any, active: int, latency_s: float, pid: int) -> float:
    """Starts ``active`` conversations at once; samples RSS until every reply arrived."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as http:
        await asyncio.gather(*(post(http, r.webhook, update(CHAT_BASE + c, 1, f"active {c}")) for c in range(active)))
    peak = rss_mb(pid)
    deadline = time.monotonic() + 120 + latency_s
    while len(r.telegram.calls("sendMessage")) < active and time.monotonic() < deadline:
        peak = max(peak, rss_mb(pid))
        await asyncio.sleep(0.1)
    await wait_for(lambda: len(r.telegram.calls("sendMessage")) >= active, 1)
    return peak


def run_load_time(workdir: Path, *, small: int = 100, large: int = 100_000, window: int = 40,
                  repeats: int = 20) -> dict[str, Any]:
    """Median ``Store.load_window`` time for a session of ``small`` vs ``large`` messages."""
    engine = create_db_engine(f"sqlite:///{workdir / 'load.db'}")
    upgrade(engine)
    store = Store(engine)
    figures: dict[str, Any] = {"window": window}
    for size in (small, large):
        session_id = store.open_session(f"telegram:bench:load:{size}", lambda: SYSTEM, 1).session_id
        for start in range(0, size, 5000):
            store.append_messages(session_id, [NewMessage(f"t{i // 2}", "user" if i % 2 == 0 else "assistant",
                                                          f"message {i} " * 10, {})
                                               for i in range(start, min(size, start + 5000))])
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            loaded = store.load_window(session_id, window)
            times.append(time.perf_counter() - t0)
        assert len(loaded) == min(window, size)
        figures[f"messages_{size}_ms"] = round(statistics.median(times) * 1000, 3)
    engine.dispose()
    return figures
