"""Several gateway processes on one PostgreSQL, in webhook mode, every update posted to all of
them: nothing lost, nothing duplicated, per-session order kept; prints throughput.

    .venv/bin/python -m bench.multi_instance --instances 2 --sessions 200 --messages 10 [--keep DIR]

The gateways' logs and configurations go to a temporary folder, removed after the run unless
``--keep`` names one. Needs PostgreSQL (``--db-url``, default: a scratch database created through GATEWAY_TEST_PG_URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.config import fakes_config
from bench.fault_injection import TOKEN, GatewayProcess, _free_port
from bench.harness import positive_int, work_folder
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

SECRET = "multi-instance-secret"
PG_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def _config(workdir: Path, name: str, telegram: FakeTelegram, model: FakeOpenAI, port: int, db_url: str) -> Path:
    return fakes_config(
        workdir / f"{name}.toml", telegram_fake=telegram, model_fake=model, port=port, db_url=db_url,
        top={"instance_id": name}, database={"pool_size": 20}, agent={"worker_threads": 32},
        bus={"lease_s": 5, "sweep_interval_s": 0.5}, delivery={"backoff_base_s": 0.05, "claim_s": 10})


def scratch_database(admin_url: str = PG_ADMIN_URL) -> tuple[str, Any]:
    """Creates a scratch database; returns its URL and a function that drops it."""
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"gw_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(admin_url).set(database=name).render_as_string(hide_password=False), drop


def _update(chat: int, index: int) -> dict[str, Any]:
    user = {"id": chat, "is_bot": False, "first_name": f"U{chat}"}
    return {"update_id": chat * 100 + index,
            "message": {"message_id": 1000 + index, "from": user, "chat": {"id": chat, "type": "private"},
                        "date": int(time.time()), "text": f"s{chat} m{index}"}}


async def _inject(ports: list[int], sessions: int, messages: int, concurrency: int = 64) -> None:
    """Posts every update to every instance; a session's messages in order, sessions in parallel."""
    limit = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession() as http:

        async def post(port: int, update: dict[str, Any]) -> None:
            for _ in range(20):
                async with http.post(f"http://127.0.0.1:{port}/telegram/webhook", json=update,
                                     headers={"X-Telegram-Bot-Api-Secret-Token": SECRET}) as resp:
                    if resp.status == 200:
                        return
                await asyncio.sleep(0.2)  # Telegram retries non-2xx too
            raise RuntimeError(f"webhook kept failing for {update['update_id']}")

        async def session(chat: int) -> None:
            for index in range(messages):
                async with limit:
                    await asyncio.gather(*(post(port, _update(chat, index)) for port in ports))

        await asyncio.gather(*(session(8_000_000 + s) for s in range(sessions)))


def run_multi_instance(*, instances: int = 2, sessions: int = 200, messages: int = 10, db_url: str,
                       workdir: Path | None = None, timeout_s: float = 300) -> dict[str, Any]:
    """Runs the experiment in ``workdir`` (the gateways' configurations and logs; default a new
    temporary folder, left in place); returns figures (lost, duplicated, out_of_order, seconds, turns/s)."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gw-multi-"))
    expected = sessions * messages
    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        model.responder = lambda req: oa.text(
            "re: " + next(m["content"] for m in reversed(req["messages"]) if m["role"] == "user").splitlines()[-1])
        procs = []
        for i in range(instances):
            port = _free_port()
            proc = GatewayProcess(_config(workdir, f"gw-{i}", telegram, model, port, db_url), port, workdir)
            proc.env_extra = {"FAULT_WEBHOOK_SECRET": SECRET}
            proc.start()
            procs.append(proc)
        try:
            for proc in procs:
                proc.wait_ready()
            started = time.monotonic()
            asyncio.run(_inject([p.port for p in procs], sessions, messages))
            injected_s = time.monotonic() - started
            deadline = started + timeout_s
            while len(telegram.calls("sendMessage")) < expected and time.monotonic() < deadline:
                time.sleep(0.1)
            elapsed = time.monotonic() - started
            time.sleep(1.0)  # a late duplicate would show now
        finally:
            for proc in procs:
                proc.terminate()
        per_chat: dict[int, list[str]] = defaultdict(list)
        for call in telegram.calls("sendMessage"):
            per_chat[int(call.params["chat_id"])].append(call.params["text"])
    lost = duplicated = out_of_order = 0
    for s in range(sessions):
        chat = 8_000_000 + s
        got = per_chat.get(chat, [])
        want = [f"re: s{chat} m{i}" for i in range(messages)]
        lost += sum(1 for w in want if w not in got)
        duplicated += len(got) - len(set(got))
        seen = [g for g in got if g in want]
        out_of_order += int(seen != sorted(set(seen), key=want.index))
    return {"instances": instances, "sessions": sessions, "messages_per_session": messages,
            "webhook_posts": expected * instances, "replies": sum(len(v) for v in per_chat.values()),
            "lost": lost, "duplicated": duplicated, "sessions_out_of_order": out_of_order,
            "inject_seconds": round(injected_s, 2), "seconds": round(elapsed, 2),
            "turns_per_second": round(expected / elapsed, 1), "workdir": str(workdir)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=positive_int, default=2)
    parser.add_argument("--sessions", type=positive_int, default=200)
    parser.add_argument("--messages", type=positive_int, default=10)
    parser.add_argument("--db-url")
    parser.add_argument("--keep", help="keep the work folder here (the gateways' logs)")
    args = parser.parse_args()
    drop = None
    db_url = args.db_url
    if db_url is None:
        db_url, drop = scratch_database()
    try:
        with work_folder(args.keep, "gw-multi-") as workdir:
            print(json.dumps(run_multi_instance(instances=args.instances, sessions=args.sessions,
                                                messages=args.messages, db_url=db_url, workdir=workdir), indent=2))
    finally:
        if drop:
            drop()


if __name__ == "__main__":
    main()
