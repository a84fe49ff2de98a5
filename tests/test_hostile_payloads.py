"""Hostile payloads never get a 5xx, a traceback or a turn: a seeded fuzz suite, end to end.

One gateway (Telegram webhook, Slack Events API, Feishu webhook with an Encrypt Key, web chat) on
loopback with the fake platforms and the fake model; per platform ~1,000 requests of
``tests.hostile_cases`` sent as raw bytes (non-UTF-8 headers and cookies included), forged,
correctly signed garbage and genuine events mixed. For each platform:

- no request is answered 5xx, and no log record is an ERROR or carries a traceback;
- forged requests get 401/403 and are never processed (the model never sees them, their chats
  get nothing);
- correctly signed garbage is acknowledged (web chat: 400 with a reason), never processed, and
  logged once at WARNING with its id;
- every genuine event, and every odd one that is usable once cleaned, is answered exactly once
  (counted in what the fake platform received).

The module runs on SQLite (``HOSTILE_COUNT`` cases per platform, 1,000) and again on PostgreSQL
(``PG_COUNT``). The seed is fixed (``HOSTILE_SEED`` overrides it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from sqlalchemy import select

from gateway.store.models import OutboxRow
from tests import raw_http
from tests.conftest import FEISHU_APP, gateway_config
from tests.fakes import openai as oa
from tests.helpers import wait_until
from tests.hostile_cases import Case, FeishuCases, SlackCases, TelegramCases, WebCases

SEED = int(os.environ.get("HOSTILE_SEED", "1711"))
COUNT = int(os.environ.get("HOSTILE_COUNT", "1000"))
PG_COUNT = COUNT * 3 // 10
"""Cases per platform on PostgreSQL: the same mix again, fewer, for what only its stricter
columns would refuse (NUL, lengths), without doubling the suite's time."""
PARALLEL = 8
EXPECTED = {
    # kind -> statuses allowed, per platform (the web chat's client is our page: it gets reasons)
    "telegram": {"forged": {401}, "unreadable": {200}, "odd": {200}, "genuine": {200}},
    "slack": {"forged": {401}, "unreadable": {200}, "odd": {200}, "genuine": {200}},
    "feishu": {"forged": {401}, "unreadable": {200}, "odd": {200}, "genuine": {200}},
    "web": {"forged": {401, 403}, "unreadable": {400}, "odd": {200}, "genuine": {200}},
}


def reply_to(request: dict[str, Any]) -> oa.TextReply:
    """Echoes the user's line (the last line of the last user message: the memory block comes first)."""
    user = [m for m in request["messages"] if m["role"] == "user"][-1]["content"]
    return oa.text(f"re: {str(user).splitlines()[-1][:200]}")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
async def gateway(request, tmp_path_factory, fake_openai, fake_telegram, fake_slack,
                  fake_feishu) -> AsyncIterator[Any]:
    """One gateway with every inbound webhook on, shared by the module's tests; once on SQLite and
    once on PostgreSQL (which refuses NUL and over-long values outright). ``gateway.case_start``
    keeps the two runs' chats apart on the shared fakes; ``gateway.case_count`` is the number of
    cases per platform."""
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters
    from gateway.store.db import create_db_engine, upgrade
    from gateway.store.sql import Store

    tmp = tmp_path_factory.mktemp("hostile")
    url = f"sqlite:///{tmp / 'gateway.db'}"
    if request.param == "postgres":
        url = request.getfixturevalue("pg_database")
        engine = create_db_engine(url)
        upgrade(engine)
        Store(engine).purge_all()
        engine.dispose()
    fake_openai.reset()
    fake_openai.responder = reply_to
    config = gateway_config(tmp, fake_openai, fake_telegram, fake_slack, fake_feishu, database={"url": url},
                            telegram={"mode": "webhook"}, feishu={"encrypt_key_env": "GATEWAY_TEST_FEISHU_ENCRYPT_KEY"},
                            agent={"streaming": []}, delivery={"backoff_base_s": 0.05, "max_attempts": 3})
    gw = Gateway(config, build_adapters(config))
    await gw.start()
    gw.case_start = 0 if request.param == "sqlite" else 100_000
    gw.case_count = COUNT if request.param == "sqlite" else PG_COUNT
    yield gw
    await gw.stop()


async def send_all(port: int, cases: list[Case]) -> list[int]:
    """Sends every case (``PARALLEL`` at a time); returns the statuses in case order."""
    limit = asyncio.Semaphore(PARALLEL)

    async def one(case: Case) -> int:
        async with limit:
            status, _ = await raw_http.post(port, case.path, case.body, case.headers)
            return status

    return list(await asyncio.gather(*(one(case) for case in cases)))


def busy_outbox(gateway: Any) -> int:
    with gateway.store.engine.connect() as conn:
        rows = conn.execute(select(OutboxRow.status)).scalars().all()
    return sum(1 for status in rows if status in ("pending", "claimed", "sending", "retry"))


async def settle(gateway: Any, answered: Callable[[], bool]) -> None:
    """Waits for the answers, then until nothing is pending (so a second answer would be seen).
    Gives up quietly: ``check`` then says which cases went unanswered."""
    try:
        await wait_until(answered, timeout=60, what="every genuine and odd event answered")
        await wait_until(lambda: gateway.store.count_inbox("pending") == 0 and busy_outbox(gateway) == 0,
                         timeout=30, what="inbox and outbox drained")
    except AssertionError:
        return
    await asyncio.sleep(0.3)


def check(platform: str, cases: list[Case], statuses: list[int], replies: Counter[str], caplog: Any,
          fake_openai: Any, kinds: int = 4) -> None:
    """The suite's assertions for one platform (see the module docstring); ``kinds``: how many of
    the four kinds the cases must include."""
    drawn = Counter(case.kind for case in cases)
    assert len(drawn) == kinds, drawn
    wrong = [(c.kind, c.label, s, c.body[:80], c.headers[-1]) for c, s in zip(cases, statuses, strict=True)
             if s not in EXPECTED[platform][c.kind]]
    summary = Counter((kind, label, status) for kind, label, status, *_ in wrong)
    assert not wrong, f"{len(wrong)} unexpected statuses: {dict(summary)}; e.g. {wrong[:3]}"

    bad_records = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info or r.exc_text]
    assert not bad_records, "errors or tracebacks logged: " + "; ".join(
        f"{r.name}: {r.getMessage()[:160]}" for r in bad_records[:5])

    unanswered = Counter((c.kind, c.label, replies[c.chat]) for c in cases
                         if c.chat is not None and replies[c.chat] != (1 if c.kind in ("genuine", "odd") else 0))
    assert not unanswered, f"(kind, variant, replies) not answered exactly once: {dict(unanswered)}"
    answered_kinds = {c.kind for c in cases if c.chat in replies}
    assert answered_kinds <= {"genuine", "odd"}, answered_kinds

    seen = json.dumps([r["json"] for r in fake_openai.requests])
    assert "FORGED" not in seen and "UNREADABLE" not in seen

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for case in cases:
        if case.kind == "unreadable" and case.log_id is not None:
            naming = [w for w in warnings if case.log_id in w]
            assert len(naming) == 1, (case.label, case.log_id, naming[:3])


@pytest.fixture(autouse=True)
def info_logs(caplog: Any) -> None:
    """WARNING and above are what the suite checks; INFO keeps capture cheap for 1,000 requests."""
    caplog.set_level(logging.INFO)


def shuffled(cases: list[Case], seed: int) -> list[Case]:
    random.Random(seed).shuffle(cases)
    return cases


async def test_telegram_webhook(gateway, fake_telegram, fake_openai, caplog) -> None:
    generator = TelegramCases(random.Random(SEED), os.environ["GATEWAY_TEST_TELEGRAM_SECRET"], gateway.case_start)
    cases = shuffled(generator.cases(gateway.case_count), SEED)
    statuses = await send_all(gateway.http_port, cases)
    wanted = {c.chat for c in cases if c.kind in ("genuine", "odd")}

    def replies() -> Counter[str]:
        return Counter(str(m["chat"]["id"]) for m in fake_telegram.sent_messages())

    await settle(gateway, lambda: wanted <= set(replies()) or any(s >= 500 for s in statuses))
    check("telegram", cases, statuses, replies(), caplog, fake_openai)


async def test_slack_events(gateway, fake_slack, fake_openai, caplog) -> None:
    generator = SlackCases(random.Random(SEED + 1), os.environ["GATEWAY_TEST_SLACK_SIGNING_SECRET"],
                           fake_slack.team_id, gateway.case_start)
    cases = shuffled(generator.cases(gateway.case_count), SEED + 1)
    for case in cases:
        if case.chat is not None:
            fake_slack.add_channel(case.chat)
    for kind in ("forged", "unreadable"):  # so a reply that should not happen would land, and be seen
        for n in range(gateway.case_start + 1, generator.n + 1):
            fake_slack.add_channel(generator.chat_of(kind, n))
    statuses = await send_all(gateway.http_port, cases)
    wanted = {c.chat for c in cases if c.kind in ("genuine", "odd")}

    def replies() -> Counter[str]:
        return Counter(str(c.params["channel"]) for c in fake_slack.calls("chat.postMessage"))

    await settle(gateway, lambda: wanted <= set(replies()) or any(s >= 500 for s in statuses))
    check("slack", cases, statuses, replies(), caplog, fake_openai)


async def test_feishu_events(gateway, fake_feishu, fake_openai, caplog) -> None:
    generator = FeishuCases(random.Random(SEED + 2), FEISHU_APP["verification_token"], FEISHU_APP["encrypt_key"],
                            fake_feishu.tenant_key, FEISHU_APP["app_id"], gateway.case_start)
    cases = shuffled(generator.cases(gateway.case_count), SEED + 2)
    statuses = await send_all(gateway.http_port, cases)
    wanted = {c.chat for c in cases if c.kind in ("genuine", "odd")}

    def replies() -> Counter[str]:
        return Counter(str(m["chat_id"]) for m in fake_feishu.sent())

    await settle(gateway, lambda: wanted <= set(replies()) or any(s >= 500 for s in statuses))
    check("feishu", cases, statuses, replies(), caplog, fake_openai)


async def test_web_chat_posts(gateway, fake_openai, caplog) -> None:
    web = gateway.adapters["web"]
    generator = WebCases(random.Random(SEED + 3), web.cookie_for, gateway.case_start)
    cases = shuffled(generator.cases(gateway.case_count), SEED + 3)
    started = time.time()
    statuses = await send_all(gateway.http_port, cases)
    wanted = {c.chat for c in cases if c.kind in ("genuine", "odd")}

    def replies() -> Counter[str]:
        """Replies delivered to web chats (the page shows what delivery sent: the outbox rows)."""
        with gateway.store.engine.connect() as conn:
            rows = conn.execute(select(OutboxRow.address, OutboxRow.status).where(
                OutboxRow.created_at >= started)).all()
        return Counter(row.address["chat_id"] for row in rows
                       if row.address["platform"] == "web" and row.status == "sent")

    await settle(gateway, lambda: wanted <= set(replies()) or any(s >= 500 for s in statuses))
    check("web", cases, statuses, replies(), caplog, fake_openai)


async def test_telegram_polling_skips_unreadable_updates(tmp_path, fake_telegram, fake_openai, running,
                                                         caplog) -> None:
    """Long polling: python-telegram-bot parses a ``getUpdates`` batch all or nothing, so one
    malformed update used to fail every poll (or reach the gateway and fail every delivery). Each
    is now dropped once with a WARNING, its offset confirmed, and the updates around it answered."""
    from tests.conftest import start_gateway

    fake_openai.responder = reply_to
    generator = TelegramCases(random.Random(SEED + 4), "unused", start=200_000)
    cases = [c for c in generator.cases(160) if c.kind != "forged"]
    updates = []
    for case in cases:
        try:
            update = json.loads(case.body)
        except (ValueError, RecursionError):
            continue
        if isinstance(update, dict) and type(update.get("update_id")) is int and update["update_id"] > 0:
            updates.append((update["update_id"], update, case))
    updates.sort(key=lambda item: item[0])
    for _, update, _ in updates:
        fake_telegram.inject(update)
    kept = [case for _, _, case in updates]
    assert {c.kind for c in kept} == {"unreadable", "odd", "genuine"}
    await start_gateway(gateway_config(tmp_path, fake_openai, fake_telegram), running)
    wanted = {c.chat for c in kept if c.kind in ("genuine", "odd")}

    def replies() -> Counter[str]:
        return Counter(str(m["chat"]["id"]) for m in fake_telegram.sent_messages())

    await wait_until(lambda: wanted <= set(replies()) and fake_telegram.confirmed_offset > updates[-1][0],
                     timeout=60, what="every readable update answered and every offset confirmed")
    await asyncio.sleep(0.5)
    check("telegram", kept, [200] * len(kept), replies(), caplog, fake_openai, kinds=3)


async def test_slack_socket_mode_acknowledges_unreadable_events(tmp_path, fake_slack, fake_openai, running,
                                                               caplog) -> None:
    """Socket Mode frames skip the HTTP checks: the listener checks the same envelope types, so a
    frame of the wrong shape is acknowledged and dropped once, and the frames around it answered."""
    from tests.conftest import start_gateway

    fake_openai.responder = reply_to
    generator = SlackCases(random.Random(SEED + 5), "unused", fake_slack.team_id, start=300_000)
    frames = []
    for case in generator.cases(200):
        try:
            payload = json.loads(case.body)
        except (ValueError, RecursionError):
            continue
        if case.kind != "forged" and isinstance(payload, dict) and payload.get("type") == "event_callback":
            frames.append((payload, case))
    for kind in ("unreadable", "odd", "genuine"):  # so that any reply, due or not, lands and is seen
        for n in range(300_001, generator.n + 1):
            fake_slack.add_channel(generator.chat_of(kind, n))
    assert {case.kind for _, case in frames} == {"unreadable", "odd", "genuine"}
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, slack={"mode": "socket"},
                            agent={"streaming": []})
    await start_gateway(config, running)
    await wait_until(lambda: fake_slack.socket_clients == 1, what="socket connection")
    since = len(fake_slack.calls("chat.postMessage"))
    envelopes = [fake_slack.push(event=payload) for payload, _ in frames]
    for envelope_id in envelopes:
        await fake_slack.wait_for_ack(envelope_id, timeout=30)
    cases = [case for _, case in frames]
    wanted = {c.chat for c in cases if c.kind in ("genuine", "odd")}

    def replies() -> Counter[str]:
        return Counter(str(c.params["channel"]) for c in fake_slack.calls("chat.postMessage")[since:])

    await wait_until(lambda: wanted <= set(replies()), timeout=60, what="every readable frame answered")
    await asyncio.sleep(0.5)
    check("slack", cases, [200] * len(cases), replies(), caplog, fake_openai, kinds=3)


async def test_feishu_long_connection_acknowledges_unreadable_events(tmp_path, fake_feishu, fake_openai, running,
                                                                     caplog) -> None:
    """Long-connection events skip the webhook checks: the same event checks run on them, so each
    frame is acknowledged (``code`` 200: Feishu would push a failed one again), an unreadable one
    logged once and dropped, and the readable ones around it answered."""
    from tests.conftest import start_gateway

    fake_openai.responder = reply_to
    generator = FeishuCases(random.Random(SEED + 6), FEISHU_APP["verification_token"], FEISHU_APP["encrypt_key"],
                            fake_feishu.tenant_key, FEISHU_APP["app_id"], start=400_000)
    events = []
    for case in generator.cases(300):
        try:
            body = json.loads(case.body)
        except (ValueError, RecursionError):
            continue
        if case.kind != "forged" and isinstance(body, dict) and "encrypt" not in body:
            events.append((body, case))
    cases = [case for _, case in events]
    assert {c.kind for c in cases} == {"unreadable", "odd", "genuine"}
    config = gateway_config(tmp_path, fake_openai, fake_feishu=fake_feishu, feishu={"mode": "websocket"},
                            agent={"streaming": []})
    await start_gateway(config, running)
    await fake_feishu.wait_ws_connected()
    acks = [await fake_feishu.ws_push(body, timeout=15) for body, _ in events]
    assert all(ack.get("code") == 200 for ack in acks), Counter(str(ack) for ack in acks)
    wanted = {c.chat for c in cases if c.kind in ("genuine", "odd")}

    def replies() -> Counter[str]:
        return Counter(str(m["chat_id"]) for m in fake_feishu.sent())

    await wait_until(lambda: wanted <= set(replies()), timeout=60, what="every readable event answered")
    await asyncio.sleep(0.5)
    check("feishu", cases, [200] * len(cases), replies(), caplog, fake_openai, kinds=3)


async def test_an_oversized_request_line_is_refused_with_one_warning(gateway, caplog) -> None:
    """A request line over aiohttp's 8 KB is answered 400 by the server; the log says so in one
    WARNING line (``gateway.ops.logs.BadRequestsBriefly``), not an ERROR with a traceback."""
    from gateway.ops.logs import quiet_bad_requests

    quiet_bad_requests()  # as ``setup_logging`` does for ``gateway run``
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.http_port)
    writer.write(b"POST /telegram/webhook?" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
    await writer.drain()
    status_line = (await asyncio.wait_for(reader.readline(), 10)).decode()
    writer.close()
    assert status_line.split()[1] == "400"
    await asyncio.sleep(0.1)
    server = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert server and all(r.levelno == logging.WARNING and not r.exc_info for r in server)
    assert "400 LineTooLong" in server[-1].getMessage()
