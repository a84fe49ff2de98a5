"""Several processes on one machine (``gateway run --workers N``) on PostgreSQL: one burst of new
chats with a slow model, answered by 1, 2 and 4 processes, beside a bare relay measured in the
same run; every reply counted per chat (nothing lost, nothing duplicated).

    .venv/bin/python -m bench.workers                       # 200 chats, 2 s model, 1, 2 and 4 processes
    .venv/bin/python -m bench.workers --processes 1,2 --chats 50
    .venv/bin/python -m bench.workers --runs 3              # medians of three alternating rounds

Each process count gets a fresh scratch database (``bench.multi_instance.scratch_database``) and a
fresh supervisor; the burst is every chat's first message posted at once to the one webhook port
(the workers share it with ``SO_REUSEPORT``). Throughput = chats / seconds from the first post to
the last reply. The floor is ``bench.relay`` (webhook in, one model call, one ``sendMessage``; no
database, one process) with the same burst and model. ``rig`` is also what
``tests/test_workers_e2e.py`` starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import create_engine, text

from bench.config import fakes_config
from bench.fault_injection import ROOT, TOKEN, _free_port
from bench.harness import (
    SECRET,
    WEBHOOK_PATH,
    cpu_seconds,
    last_user_line,
    non_negative,
    positive_int,
    positive_ints,
    post,
    update,
    work_folder,
)
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

INSTANCE_ID = "bench-workers"
CHAT_BASE = 7_000_000


def write_config(workdir: Path, telegram: FakeTelegram, model: FakeOpenAI, port: int, *, db_url: str, workers: int,
                 worker_threads: int = 200, pool_size: int = 8, mode: str = "webhook") -> Path:
    """A gateway config for ``workers`` processes pointed at the fakes (PostgreSQL ``db_url``)."""
    return fakes_config(
        workdir / f"workers{workers}.toml", telegram_fake=telegram, model_fake=model, port=port, db_url=db_url,
        mode=mode, top={"instance_id": INSTANCE_ID, "workers": workers, "stop_timeout_s": 10},
        database={"pool_size": pool_size}, agent={"worker_threads": worker_threads}, tools={"browser_enabled": False},
        bus={"lease_s": 6, "sweep_interval_s": 0.5}, memory={"promote": False},
        media={"directory": str(workdir / "media")}, delivery={"backoff_base_s": 0.05}, telegram={"poll_timeout_s": 1},
        logging={"level": "INFO"})


@dataclass
class Rig:
    """A running ``gateway run`` (the supervisor of ``workers`` processes) wired to the fakes."""

    telegram: FakeTelegram
    model: FakeOpenAI
    proc: subprocess.Popen[bytes]
    port: int
    db_url: str
    log: Path

    @property
    def webhook(self) -> str:
        return f"http://127.0.0.1:{self.port}{WEBHOOK_PATH}"

    def instances(self) -> dict[str, int]:
        """``instances`` rows: instance id → pid."""
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                return {row[0]: row[1] for row in conn.execute(text("SELECT id, pid FROM instances"))}
        finally:
            engine.dispose()

    def query(self, sql: str, **params: Any) -> list[Any]:
        engine = create_engine(self.db_url)
        try:
            with engine.connect() as conn:
                return list(conn.execute(text(sql), params))
        finally:
            engine.dispose()

    def worker_pids(self) -> list[int]:
        """The supervisor's child processes (Linux ``/proc``)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        with contextlib.suppress(OSError):
            return [int(p) for p in children.read_text().split()]
        return []

    def cpu_seconds(self) -> float:
        """CPU seconds of the supervisor and its live workers."""
        total = 0.0
        for pid in [self.proc.pid, *self.worker_pids()]:
            with contextlib.suppress(OSError):
                total += cpu_seconds(pid)
        return total

    def wait_workers_ready(self, workers: int, timeout: float = 180) -> None:
        """Until ``/readyz`` answers 200 and every worker holds its instance id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1):
                    pass
                if workers == 1 or f"all {workers} workers ready" in self.log.read_text():
                    return
            except Exception:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"gateway did not become ready; see {self.log}")

    def stop(self, timeout: float = 40) -> int:
        """SIGTERM, then the exit status (SIGKILL after ``timeout``: status -9)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _env() -> dict[str, str]:
    return {**os.environ, "FAULT_OPENAI_KEY": "sk-test", "FAULT_TELEGRAM_TOKEN": TOKEN,
            "FAULT_WEBHOOK_SECRET": SECRET, "NO_PROXY": "127.0.0.1,localhost", "PYTHONPATH": str(ROOT)}


@contextlib.contextmanager
def rig(workdir: Path, db_url: str, workers: int, **config: Any) -> Iterator[Rig]:
    """Starts the fakes and ``gateway run`` with ``workers`` processes; stops it at the end."""
    workdir.mkdir(parents=True, exist_ok=True)
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        port = _free_port()
        path = write_config(workdir, telegram, model, port, db_url=db_url, workers=workers, **config)
        log = workdir / f"workers{workers}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "gateway", "--config", str(path), "run"],
                                    cwd=workdir, env=_env(), stdout=out, stderr=subprocess.STDOUT)
        r = Rig(telegram, model, proc, port, db_url, log)
        try:
            r.wait_workers_ready(workers)
            yield r
        finally:
            r.stop()


async def burst(url: str, chats: int, prefix: str = "b", first: int = 0) -> None:
    """Posts the first message of ``chats`` new chats (``CHAT_BASE + first`` on) at once, text
    ``<prefix><n>``; each post retried on a non-2xx answer, as Telegram does."""
    connector = aiohttp.TCPConnector(limit=chats)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(post(http, url, update(CHAT_BASE + first + c, 1, f"{prefix}{c}"))
                               for c in range(chats)))


def count_replies(telegram: FakeTelegram, chats: int, prefix: str = "b", first: int = 0) -> dict[str, int]:
    """Replies per chat of a burst: ``lost`` (chats without their reply), ``duplicated`` (extra
    replies), ``wrong`` (a reply to another chat's message)."""
    per_chat: Counter[int] = Counter()
    wrong = 0
    low = CHAT_BASE + first
    for call in telegram.calls("sendMessage"):
        chat = int(call.params["chat_id"])
        if not low <= chat < low + chats:
            continue
        per_chat[chat] += 1
        wrong += call.params["text"] != f"re: {prefix}{chat - low}"
    lost = sum(1 for c in range(chats) if per_chat[low + c] == 0)
    return {"replies": sum(per_chat.values()), "lost": lost,
            "duplicated": sum(n - 1 for n in per_chat.values() if n > 1), "wrong": wrong}


def _wait_replies(telegram: FakeTelegram, chats: int, timeout: float) -> float:
    """Monotonic time of the reply that completed the burst (or of the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        calls = telegram.calls("sendMessage")
        if len({c.params["chat_id"] for c in calls}) >= chats:
            return max(c.time for c in calls)
        time.sleep(0.02)
    return time.monotonic()


def run_workers(workdir: Path, processes: int, *, chats: int = 200, latency_s: float = 2.0,
                timeout: float = 180.0, worker_threads: int = 200) -> dict[str, Any]:
    """One burst against ``processes`` processes on a scratch PostgreSQL database; figures."""
    from bench.multi_instance import scratch_database

    db_url, drop = scratch_database()
    try:
        with rig(workdir / f"p{processes}", db_url, processes, worker_threads=worker_threads) as r:
            r.model.responder = lambda req: oa.delay(latency_s, oa.text(f"re: {last_user_line(req)}", pieces=1))
            cpu_before = r.cpu_seconds()
            started = time.monotonic()
            asyncio.run(burst(r.webhook, chats))
            stored_s = time.monotonic() - started
            last = _wait_replies(r.telegram, chats, timeout)
            cpu = r.cpu_seconds() - cpu_before
            time.sleep(1.0)  # a late duplicate would show now
            counted = count_replies(r.telegram, chats)
    finally:
        drop()
    seconds = last - started
    return {"processes": processes, "chats": chats, "model_latency_s": latency_s, **counted,
            "burst_stored_s": round(stored_s, 2), "seconds": round(seconds, 2),
            "turns_per_s": round(counted["replies"] / seconds, 1),
            "cpu_ms_per_turn": round(1000 * cpu / max(1, counted["replies"]), 1)}


def run_floor(workdir: Path, *, chats: int = 200, latency_s: float = 2.0, timeout: float = 60.0) -> dict[str, Any]:
    """The same burst through ``bench.relay`` (no database, one process)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        model.responder = lambda req: oa.delay(latency_s, oa.text(f"re: {last_user_line(req)}", pieces=1))
        port = _free_port()
        proc = subprocess.Popen([sys.executable, "-m", "bench.relay", str(port), f"{model.url}/v1", telegram.url,
                                 TOKEN], cwd=workdir, env=_env())
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            started = time.monotonic()
            asyncio.run(burst(f"http://127.0.0.1:{port}{WEBHOOK_PATH}", chats))
            last = _wait_replies(telegram, chats, timeout)
            counted = count_replies(telegram, chats)
        finally:
            proc.terminate()
            proc.wait(10)
    seconds = last - started
    return {"floor": "bench.relay", "chats": chats, **counted, "seconds": round(seconds, 2),
            "turns_per_s": round(counted["replies"] / seconds, 1)}


def run_scaling(workdir: Path, processes: list[int], *, chats: int = 200, latency_s: float = 2.0,
                worker_threads: int = 200) -> dict[str, Any]:
    """The floor, then each process count; ratios to one process (the first count) and to the floor."""
    floor = run_floor(workdir / "floor", chats=chats, latency_s=latency_s)
    runs = [run_workers(workdir, n, chats=chats, latency_s=latency_s, worker_threads=worker_threads)
            for n in processes]
    base = runs[0]["turns_per_s"]
    for run in runs:
        run["vs_first"] = round(run["turns_per_s"] / base, 2) if base else None
        run["vs_floor"] = round(run["turns_per_s"] / floor["turns_per_s"], 2) if floor["turns_per_s"] else None
    return {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_average": [round(x, 1) for x in os.getloadavg()]},
            "floor": floor, "runs": runs}


def run_repeated(workdir: Path, processes: list[int], runs: int, **kwargs: Any) -> dict[str, Any]:
    """``run_scaling`` ``runs`` times (floor and counts alternate, so load changes hit all alike);
    medians of turns/s and of the ratios per process count."""
    from statistics import median

    rounds = [run_scaling(workdir / f"r{i}", processes, **kwargs) for i in range(runs)]
    summary = {}
    for n in processes:
        mine = [r for round_ in rounds for r in round_["runs"] if r["processes"] == n]
        summary[str(n)] = {key: median(r[key] for r in mine) for key in ("turns_per_s", "vs_first", "vs_floor")}
        summary[str(n)]["lost"] = sum(r["lost"] for r in mine)
        summary[str(n)]["duplicated"] = sum(r["duplicated"] for r in mine)
    summary["floor_turns_per_s"] = median(r["floor"]["turns_per_s"] for r in rounds)
    return {"median": summary, "rounds": rounds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=positive_ints, default=[1, 2, 4],
                        help="comma-separated process counts (first = the base)")
    parser.add_argument("--chats", type=positive_int, default=200)
    parser.add_argument("--latency", type=non_negative, default=2.0, help="model latency, seconds")
    parser.add_argument("--worker-threads", type=positive_int, default=200, help="agent.worker_threads of each process")
    parser.add_argument("--runs", type=positive_int, default=1, help="repeat everything; medians reported")
    parser.add_argument("--keep", help="keep the work folder here (the logs)")
    args = parser.parse_args()
    with work_folder(args.keep, "gw-workers-") as workdir:
        figures = run_repeated(workdir, args.processes, args.runs, chats=args.chats,
                               latency_s=args.latency, worker_threads=args.worker_threads)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
