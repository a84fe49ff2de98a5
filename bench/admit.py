"""The admit of a batch of new chats' first messages (``Inbound._admit_many``: what a gateway does
with the messages that arrived while one write was under way, at most 32 at a time), replayed on a
running gateway (in this process, its Telegram adapter and model pointed at the loopback fakes) one
batch after the other, without the burst around it: its statements (round trips to PostgreSQL),
wall-clock and CPU time, on SQLite or PostgreSQL.

    python -m bench.admit [--batch 32] [--rounds 20] [--postgres]

Each batch is ``batch`` messages of as many new senders in their DMs: the senders created, the
inbox rows written, each chat's lane claimed with its new session (the turns are not run: the
lanes are released afterwards). ``--postgres``: a scratch database of the local PostgreSQL
(``GATEWAY_TEST_PG_URL`` or ``postgres@127.0.0.1``), dropped afterwards.

Prints JSON: ``backend``, ``batch``, ``rounds``, ``statements_per_batch`` (counted in separate
rounds: a statement listener makes every statement go through SQLAlchemy), ``wall_ms_per_batch``
and ``cpu_ms_per_batch`` (medians; ``time.thread_time`` of the thread that admits).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import event, update

from bench.config import fakes_config
from bench.fault_injection import TOKEN
from bench.harness import positive_int
from bench.multi_instance import scratch_database
from gateway.core.types import ChatAddress, InboundMessage, Sender
from gateway.store.db import write_tx
from gateway.store.models import LaneRow
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram


@contextlib.contextmanager
def _database(postgres: bool, workdir: Path) -> Iterator[str]:
    if not postgres:
        yield f"sqlite:///{workdir / 'admit.db'}"
        return
    url, drop = scratch_database(os.environ.get("GATEWAY_TEST_PG_URL",
                                                "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"))
    try:
        yield url
    finally:
        drop()


def _batch(tenant: str, first: int, size: int) -> list[InboundMessage]:
    return [InboundMessage(address=ChatAddress("telegram", tenant, str(first + i)), message_id=f"{first + i}:1",
                           chat_type="dm", sender=Sender(str(first + i), f"User {first + i}"),
                           text=f"hello from {first + i}", received_at=time.time()) for i in range(size)]


async def _run(workdir: Path, db_url: str, batch: int, rounds: int) -> dict[str, Any]:
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters
    from gateway.core.config import load_config

    os.environ.update({"FAULT_OPENAI_KEY": "sk-test", "FAULT_TELEGRAM_TOKEN": TOKEN,
                       "FAULT_WEBHOOK_SECRET": "bench-admit-secret-0123"})
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        path = fakes_config(workdir / "admit.toml", telegram_fake=telegram, model_fake=model, port=0, db_url=db_url,
                            memory={"promote": False}, media={"directory": str(workdir / "media")},
                            tools={"browser_enabled": False})
        config = load_config(path)
        gateway = Gateway(config, build_adapters(config))
        await gateway.start()
        try:
            tenant = TOKEN.split(":", 1)[0]
            inbound, engine = gateway.inbound, gateway.engine
            walls: list[float] = []
            cpus: list[float] = []
            counts: list[int] = []

            def admit(messages: list[InboundMessage]) -> tuple[float, float]:
                wall, cpu = time.perf_counter(), time.thread_time()
                admitted = inbound._admit_many(messages)
                wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
                assert all(entry[4] for entry in admitted), "a message of the batch was not stored"
                with write_tx(engine) as conn:  # no turn runs: the lanes claimed are given back
                    conn.execute(update(LaneRow).values(lease_owner=None, lease_until=0.0))
                return wall, cpu

            first = 9_100_000
            for index in range(rounds + 2):  # two rounds to warm up
                wall, cpu = await asyncio.to_thread(admit, _batch(tenant, first, batch))
                first += batch
                if index >= 2:
                    walls.append(wall * 1000)
                    cpus.append(cpu * 1000)
            for _ in range(3):
                counted = [0]

                def count(*_args: Any, counted: list[int] = counted) -> None:
                    counted[0] += 1

                event.listen(engine, "before_cursor_execute", count)
                try:
                    await asyncio.to_thread(admit, _batch(tenant, first, batch))
                finally:
                    event.remove(engine, "before_cursor_execute", count)
                first += batch
                counts.append(counted[0] - 1)  # the lanes' release is not the admit's
        finally:
            await gateway.stop()
    return {"backend": engine.dialect.name, "batch": batch, "rounds": rounds,
            "statements_per_batch": statistics.median(counts),
            "wall_ms_per_batch": round(statistics.median(walls), 2),
            "cpu_ms_per_batch": round(statistics.median(cpus), 2)}


def run_admit(workdir: Path, *, batch: int = 32, rounds: int = 20, postgres: bool = False) -> dict[str, Any]:
    """Replays ``rounds`` batches of ``batch`` new chats' admit (above) in ``workdir`` on a fresh
    SQLite file, or with ``postgres`` on a scratch PostgreSQL database; returns the figures."""
    workdir.mkdir(parents=True, exist_ok=True)
    with _database(postgres, workdir) as db_url:
        return asyncio.run(_run(workdir, db_url, batch, rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description="a batch of new chats' admit: statements, wall and CPU time")
    parser.add_argument("--batch", type=positive_int, default=32)
    parser.add_argument("--rounds", type=positive_int, default=20)
    parser.add_argument("--postgres", action="store_true", help="on a scratch database of the local PostgreSQL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gw-admit-") as workdir:
        print(json.dumps(run_admit(Path(workdir), batch=args.batch, rounds=args.rounds, postgres=args.postgres),
                         indent=2))


if __name__ == "__main__":
    main()
