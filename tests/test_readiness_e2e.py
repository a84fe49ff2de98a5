"""Start-up readiness, end to end: events posted from the moment the gateway's port accepts
connections (Feishu, Slack Events API, Telegram webhook, web chat) are each either answered
exactly once or refused with a non-2xx (the platforms redeliver those); ``/healthz`` answers
during start-up while ``/readyz`` says 503 until every adapter has started.

The real lark-oapi, slack-bolt, python-telegram-bot and openai clients run against the loopback
fakes; the fake Feishu answers ``bot/v3/info`` slowly (a distant data centre), which is the
window where a group mention used to be acknowledged and dropped as "not addressed"."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from gateway.app.gateway import Gateway
from gateway.app.wiring import build_adapters
from tests.conftest import gateway_config
from tests.fakes import openai as oa
from tests.fakes.feishu import post_text
from tests.helpers import wait_until
from tests.web_client import WebClient

GROUP = "oc_fakegroup0000000000000000000001"
SLACK_DM = "D0ALICE001"
TELEGRAM_CHAT = 5550123
TOKEN = re.compile(r"tok-[a-z]+-\d{4}")
POSTS_AFTER_READY = 4
"""Events each platform posts after ``/readyz`` turned 200 (so each has some that must be answered)."""

Post = Callable[[str], Awaitable[int]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def echo(request: dict[str, Any]) -> oa.Reply:
    user = next(m["content"] for m in reversed(request["messages"]) if m["role"] == "user")
    tokens = TOKEN.findall(str(user))
    return oa.text(f"re: {tokens[-1] if tokens else '?'}")


def answered(texts: list[str]) -> Counter[str]:
    """How often each token was answered (``re: <token>``) in the platform's sent messages."""
    return Counter(token for text in texts for token in re.findall(r"re: (tok-[a-z]+-\d{4})", text))


@pytest.mark.timeout(120)
async def test_events_from_the_first_accepted_connection_are_answered_once_or_refused(
        tmp_path, fake_openai, fake_telegram, fake_slack, fake_feishu, running):
    fake_openai.reset()
    fake_openai.responder = echo
    fake_feishu.reset()
    fake_feishu.latency["bot_info"] = 0.8  # the bot's open_id arrives late: mentions cannot be recognised before
    port = free_port()
    config = gateway_config(tmp_path, fake_openai, fake_telegram=fake_telegram, fake_slack=fake_slack,
                            fake_feishu=fake_feishu, http={"port": port}, telegram={"mode": "webhook"},
                            agent={"streaming": []})
    gateway = Gateway(config, build_adapters(config))
    running.append(gateway)
    base = f"http://127.0.0.1:{port}"
    secret = config.secret(config.telegram.webhook_secret_env)
    slack_since = len(fake_slack.calls("chat.postMessage"))
    telegram_since = len(fake_telegram.sent_messages(TELEGRAM_CHAT))
    http = aiohttp.ClientSession()
    web = WebClient(base)
    probes: list[tuple[int, int]] = []  # (/healthz, /readyz) while starting
    outcomes: dict[str, list[tuple[str, int]]] = {"feishu": [], "slack": [], "telegram": [], "web": []}

    async def feishu(token: str) -> int:
        event = fake_feishu.text_event(token, chat_id=GROUP, chat_type="group", mention_bot=True)
        return (await fake_feishu.post_event(f"{base}/feishu/events", event))[0]

    n_slack = iter(range(10_000))

    async def slack(token: str) -> int:
        ts = f"{1735700000 + next(n_slack)}.000100"
        event = {"type": "message", "user": "U0ALICE001", "text": token, "ts": ts, "channel": SLACK_DM,
                 "channel_type": "im", "event_ts": ts, "team": "T0FAKE0001"}
        return (await fake_slack.post_event(f"{base}/slack/events", event)).status

    n_telegram = iter(range(1, 10_000))

    async def telegram(token: str) -> int:
        n = next(n_telegram)
        update = {"update_id": 880_000 + n, "message": {
            "message_id": n, "date": 1735700000, "text": token, "chat": {"id": TELEGRAM_CHAT, "type": "private"},
            "from": {"id": TELEGRAM_CHAT, "is_bot": False, "first_name": "Tess"}}}
        async with http.post(f"{base}/telegram/webhook", json=update,
                             headers={"X-Telegram-Bot-Api-Secret-Token": secret}) as response:
            return response.status

    opened: list[bool] = []

    async def web_chat(token: str) -> int:
        if not opened:  # the page and its event stream are served from the first connection on
            await web.open()
            web.listen()
            opened.append(True)
        return (await web.say(token)).status

    async def pound(platform: str, post: Post) -> None:
        n, after_ready = 0, 0
        while after_ready < POSTS_AFTER_READY:
            token = f"tok-{platform}-{n:04d}"
            ready_before = gateway.started
            try:
                status = await post(token)
            except aiohttp.ClientConnectorError:  # the port is not open yet: nothing reached the gateway
                await asyncio.sleep(0.005)
                continue
            outcomes[platform].append((token, status))
            n += 1
            after_ready += ready_before
            await asyncio.sleep(0.01)

    async def probe() -> None:
        while not gateway.started:
            try:
                async with http.get(f"{base}/healthz") as health, http.get(f"{base}/readyz") as ready:
                    probes.append((health.status, ready.status))
            except aiohttp.ClientConnectorError:
                pass
            await asyncio.sleep(0.01)

    try:
        starting = asyncio.create_task(gateway.start())
        await asyncio.gather(pound("feishu", feishu), pound("slack", slack), pound("telegram", telegram),
                             pound("web", web_chat), probe(), starting)
        async with http.get(f"{base}/readyz") as ready:
            assert ready.status == 200

        def texts() -> dict[str, list[str]]:
            return {
                "feishu": [json.dumps(post_text(m["content"])) for m in fake_feishu.sent(GROUP)],
                "slack": [c.params["text"] for c in fake_slack.calls("chat.postMessage")[slack_since:]
                          if c.params["channel"] == SLACK_DM],
                "telegram": [m["text"] for m in fake_telegram.sent_messages(TELEGRAM_CHAT)[telegram_since:]],
                # The page shows a turn's answer as its transcript row (a delivery arriving after the
                # row is sent as "settled"): rows per turn here, deliveries counted below.
                "web": [e["text"] for e in web.of("row", lambda e: e["role"] == "assistant")],
            }

        accepted = {p: [t for t, status in posted if 200 <= status < 300] for p, posted in outcomes.items()}
        def unanswered() -> dict[str, list[str]]:
            seen = texts()
            return {p: sorted(set(tokens) - set(answered(seen[p]))) for p, tokens in accepted.items()}

        try:
            await wait_until(lambda: not any(unanswered().values()), timeout=60, what="a reply to each")
        except AssertionError:
            raise AssertionError(f"acknowledged, never answered: {unanswered()}") from None
        await asyncio.sleep(1.0)  # a late duplicate would show up now
        seen = texts()
        for platform, posted in outcomes.items():
            counts = answered(seen[platform])
            refused = [(t, status) for t, status in posted if not 200 <= status < 300]
            assert refused, f"{platform}: no event arrived before the gateway was ready ({posted})"
            assert all(status == 503 for _, status in refused), f"{platform}: {refused}"
            assert accepted[platform], f"{platform}: nothing was accepted ({posted})"
            assert all(counts[t] == 1 for t in accepted[platform]), \
                f"{platform}: acknowledged but not answered exactly once: " \
                f"{[(t, counts[t]) for t in accepted[platform] if counts[t] != 1]}"
            assert not any(counts[t] for t, _ in refused), f"{platform}: a refused event was answered"
        assert len(web.of("reply")) + len(web.of("settled")) == len(accepted["web"])  # one delivery each
        # Liveness and readiness told apart while starting: alive, not ready.
        assert (200, 503) in probes, probes
    finally:
        await web.close()
        await http.close()
