"""Shared fixtures: loopback fakes of Telegram and the OpenAI API, a page server, a gateway factory."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aiohttp import web

from tests.fakes.openai import FakeOpenAI
from tests.fakes.server import ThreadedServer
from tests.fakes.telegram import FakeTelegram

if TYPE_CHECKING:
    from tests.fakes.feishu import FakeFeishu

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ["no_proxy"] = os.environ["NO_PROXY"]

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "platforms"
if not FIXTURES.is_dir():  # a clone with shared/ inside it
    FIXTURES = Path(__file__).resolve().parents[1] / "shared" / "fixtures" / "platforms"

TEST_TOKEN = "7000000001:AAFakeTokenForLoopbackTestsOnly0000"
os.environ["GATEWAY_TEST_TELEGRAM_TOKEN"] = TEST_TOKEN
os.environ["GATEWAY_TEST_TELEGRAM_SECRET"] = "webhook-secret-0123456789"
os.environ["GATEWAY_TEST_OPENAI_KEY"] = "sk-test"
FEISHU_APP = json.loads((FIXTURES / "feishu" / "expected.json").read_text())["_app"]
os.environ["GATEWAY_TEST_FEISHU_APP_ID"] = FEISHU_APP["app_id"]
os.environ["GATEWAY_TEST_FEISHU_APP_SECRET"] = FEISHU_APP["app_secret"]
os.environ["GATEWAY_TEST_FEISHU_TOKEN"] = FEISHU_APP["verification_token"]
os.environ["GATEWAY_TEST_FEISHU_ENCRYPT_KEY"] = FEISHU_APP["encrypt_key"]


def fixture(platform: str, name: str) -> dict[str, Any]:
    """Loads ``shared/fixtures/platforms/<platform>/<name>``."""
    return json.loads((FIXTURES / platform / name).read_text())


class PageServer(ThreadedServer):
    """Serves test pages: ``/page`` (HTML with a known sentence)."""

    PAGE = (
        "<html><head><title>Release notes</title><style>p{color:red}</style></head>"
        "<body><h1>Release 2.0</h1><p>The release ships the durable inbox.</p>"
        "<script>var hidden = 'not text';</script><p>Codename: amber-falcon-42.</p></body></html>"
    )

    def build_app(self) -> web.Application:
        async def page(_: web.Request) -> web.Response:
            return web.Response(text=self.PAGE, content_type="text/html")

        app = web.Application()
        app.add_routes([web.get("/page", page)])
        return app


@pytest.fixture(scope="module")
def fake_telegram() -> Iterator[FakeTelegram]:
    with FakeTelegram(token=TEST_TOKEN) as fake:
        yield fake


@pytest.fixture(scope="module")
def fake_feishu() -> Iterator[FakeFeishu]:
    from tests.fakes.feishu import FakeFeishu  # imports lark-oapi (slow): only for Feishu tests

    with FakeFeishu(**FEISHU_APP) as fake:
        yield fake


@pytest.fixture(scope="module")
def fake_openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(api_key="sk-test") as fake:
        yield fake


@pytest.fixture(scope="module")
def page_server() -> Iterator[PageServer]:
    with PageServer() as server:
        yield server


def gateway_config(tmp_path: Path, fake_openai: FakeOpenAI, fake_telegram: FakeTelegram | None = None,
                   fake_feishu: FakeFeishu | None = None, **sections: dict[str, Any]):
    """A ``GatewayConfig`` on a fresh SQLite file, pointed at the fakes."""
    from gateway.config import load_config

    overrides: dict[str, Any] = {
        "database": {"url": f"sqlite:///{tmp_path / 'gateway.db'}"},
        "http": {"host": "127.0.0.1", "port": 0},
        "llm": {"base_url": f"{fake_openai.url}/v1", "api_key_env": "GATEWAY_TEST_OPENAI_KEY",
                "model": "gpt-4o-mini", "max_retries": 0},
        "tools": {"web_fetch_allow_private": True},
        "bus": {"sweep_interval_s": 0.5},
        "delivery": {"backoff_base_s": 0.05},
    }
    if fake_telegram is not None:
        overrides["telegram"] = {"enabled": True, "token_env": "GATEWAY_TEST_TELEGRAM_TOKEN",
                                 "base_url": fake_telegram.url, "poll_timeout_s": 1,
                                 "webhook_secret_env": "GATEWAY_TEST_TELEGRAM_SECRET"}
    if fake_feishu is not None:  # plain events by default: point encrypt_key_env at the key to encrypt
        overrides["feishu"] = {"enabled": True, "app_id_env": "GATEWAY_TEST_FEISHU_APP_ID",
                               "app_secret_env": "GATEWAY_TEST_FEISHU_APP_SECRET",
                               "verification_token_env": "GATEWAY_TEST_FEISHU_TOKEN",
                               "encrypt_key_env": "GATEWAY_TEST_FEISHU_NO_ENCRYPT_KEY", "domain": fake_feishu.url}
    for name, values in sections.items():
        overrides.setdefault(name, {}).update(values)
    return load_config(None, **overrides)


@pytest.fixture
async def running() -> AsyncIterator[list[Any]]:
    """Collects gateways started by a test and stops them at its end."""
    gateways: list[Any] = []
    yield gateways
    for gateway in gateways:
        await gateway.stop()


async def start_gateway(config, gateways: list[Any]):
    """Builds and starts a gateway with the configured adapters; registers it for stopping."""
    from gateway.app import Gateway
    from gateway.wiring import build_adapters

    gateway = Gateway(config, build_adapters(config))
    await gateway.start()
    gateways.append(gateway)
    return gateway
