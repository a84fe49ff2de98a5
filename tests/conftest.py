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
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

if TYPE_CHECKING:
    from tests.fakes.feishu import FakeFeishu

os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ["no_proxy"] = os.environ["NO_PROXY"]

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "platforms"
"""Recorded platform payloads with their expected normalized results (copied from the team's
shared fixtures so the repository tests itself wherever it is cloned)."""

TEST_TOKEN = "7000000001:AAFakeTokenForLoopbackTestsOnly0000"
os.environ["GATEWAY_TEST_TELEGRAM_TOKEN"] = TEST_TOKEN
os.environ["GATEWAY_TEST_TELEGRAM_SECRET"] = "webhook-secret-0123456789"
os.environ["GATEWAY_TEST_OPENAI_KEY"] = "sk-test"
os.environ["GATEWAY_TEST_SLACK_BOT_TOKEN"] = "xoxb-fake-0001"
os.environ["GATEWAY_TEST_SLACK_SIGNING_SECRET"] = "fake-signing-secret-0001"
os.environ["GATEWAY_TEST_SLACK_APP_TOKEN"] = "xapp-1-fake"
FEISHU_APP = json.loads((FIXTURES / "feishu" / "expected.json").read_text())["_app"]
os.environ["GATEWAY_TEST_FEISHU_APP_ID"] = FEISHU_APP["app_id"]
os.environ["GATEWAY_TEST_FEISHU_APP_SECRET"] = FEISHU_APP["app_secret"]
os.environ["GATEWAY_TEST_FEISHU_TOKEN"] = FEISHU_APP["verification_token"]
os.environ["GATEWAY_TEST_FEISHU_ENCRYPT_KEY"] = FEISHU_APP["encrypt_key"]


def fixture(platform: str, name: str) -> dict[str, Any]:
    """Loads ``tests/fixtures/platforms/<platform>/<name>``."""
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
def fake_slack() -> Iterator[FakeSlack]:
    with FakeSlack() as fake:
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
                   fake_slack: FakeSlack | None = None, fake_feishu: FakeFeishu | None = None,
                   **sections: Any):
    """A ``GatewayConfig`` on a fresh SQLite file, pointed at the fakes. ``sections``: a table's
    keys (merged over these defaults), or a list of tables (``chats=[...]``)."""
    from gateway.core.config import load_config

    overrides: dict[str, Any] = {
        "database": {"url": f"sqlite:///{tmp_path / 'gateway.db'}"},
        "http": {"host": "127.0.0.1", "port": 0},
        "llm": {"base_url": f"{fake_openai.url}/v1", "api_key_env": "GATEWAY_TEST_OPENAI_KEY",
                "model": "gpt-4o-mini", "max_retries": 0},
        "tools": {"web_fetch_allow_private": True},
        "bus": {"sweep_interval_s": 0.5},
        "delivery": {"backoff_base_s": 0.05},
        "approvals": {"require_for": []},  # tests of approvals turn them on
        "memory": {"promote": False},  # no extra model call per turn; tests of memory write-back turn it on
        "media": {"directory": str(tmp_path / "media"), "album_wait_s": 0.5},
    }
    if fake_telegram is not None:
        overrides["telegram"] = {"enabled": True, "token_env": "GATEWAY_TEST_TELEGRAM_TOKEN",
                                 "base_url": fake_telegram.url, "poll_timeout_s": 1,
                                 "webhook_secret_env": "GATEWAY_TEST_TELEGRAM_SECRET"}
    if fake_slack is not None:
        overrides["slack"] = {"enabled": True, "bot_token_env": "GATEWAY_TEST_SLACK_BOT_TOKEN",
                              "signing_secret_env": "GATEWAY_TEST_SLACK_SIGNING_SECRET",
                              "app_token_env": "GATEWAY_TEST_SLACK_APP_TOKEN", "api_url": f"{fake_slack.url}/api/"}
    if fake_feishu is not None:  # plain events by default: point encrypt_key_env at the key to encrypt
        overrides["feishu"] = {"enabled": True, "app_id_env": "GATEWAY_TEST_FEISHU_APP_ID",
                               "app_secret_env": "GATEWAY_TEST_FEISHU_APP_SECRET",
                               "verification_token_env": "GATEWAY_TEST_FEISHU_TOKEN",
                               "encrypt_key_env": "GATEWAY_TEST_FEISHU_NO_ENCRYPT_KEY", "domain": fake_feishu.url}
    for name, values in sections.items():
        if isinstance(values, dict):
            overrides.setdefault(name, {}).update(values)
        else:
            overrides[name] = values
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
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters

    gateway = Gateway(config, build_adapters(config))
    await gateway.start()
    gateways.append(gateway)
    return gateway


PG_ADMIN_URL = os.environ.get("GATEWAY_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for this test run; its URL. Dropped at the end.

    Skips when no server answers, except in CI (``CI`` set), where PostgreSQL tests must run.
    """
    import uuid

    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"gw_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        admin.dispose()
        if os.environ.get("CI"):
            raise RuntimeError(f"PostgreSQL is required in CI but unreachable at {PG_ADMIN_URL}: {exc}") from exc
        pytest.skip(f"PostgreSQL unreachable ({type(exc).__name__}); set GATEWAY_TEST_PG_URL")
    url = make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> Iterator[str]:
    """A migrated, empty database URL of each backend (store contract tests run on both)."""
    from gateway.store.db import create_db_engine, upgrade
    from gateway.store.sql import Store

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
    else:
        url = request.getfixturevalue("pg_database")
    engine = create_db_engine(url)
    upgrade(engine)
    Store(engine).purge_all()
    engine.dispose()
    yield url


@pytest.fixture(autouse=True)
def no_secret_in_any_log_record(caplog):
    """Every test runs with DEBUG log capture through the filter every production handler carries
    (``gateway.ops.logs.RedactSecrets``); afterwards no configured test secret may appear in any record."""
    import logging

    from gateway.ops.logs import RedactSecrets

    secrets = [value for name, value in os.environ.items() if name.startswith("GATEWAY_TEST_") and len(value) >= 6]
    redact = RedactSecrets(secrets)
    caplog.handler.addFilter(redact)
    caplog.set_level(logging.DEBUG)
    yield
    caplog.handler.removeFilter(redact)
    for record in caplog.records:
        text = record.getMessage() + (record.exc_text or "")
        leaked = [s for s in secrets if s in text]
        assert not leaked, f"secret in a log record of {record.name}: {text[:200]}"


@pytest.fixture
def keep_logging(monkeypatch):
    """``main`` configures the process's logging and hooks: leave pytest's alone."""
    monkeypatch.setattr("gateway.app.cli.setup_logging", lambda level, secrets: None)
    monkeypatch.setattr("gateway.app.cli.install_hooks", lambda: None)
    monkeypatch.delenv("GATEWAY_CONFIG", raising=False)


def pytest_asyncio_loop_factories(config, item):
    """Every async test runs on the loop ``gateway run`` serves on: uvloop where it is installed
    (``gateway.app.loops``, config ``event_loop = "auto"``), so the adapters' in-process end-to-end
    tests exercise the production loop. Threads that make their own loop (the agent's bridge, the
    Feishu long connection) keep asyncio's, as in production."""
    from gateway.app.loops import loop_factory

    name, factory = loop_factory("auto")
    return {name.split()[0]: factory}
