"""The gateway config every benchmark and fault-injection run writes: pointed at the loopback fakes
(Telegram Bot API, OpenAI), each run adding or changing only the keys it is about.

    fakes_config(workdir / "gateway.toml", telegram_fake=t, model_fake=m, port=p, db_url=url,
                 bus={"lease_s": 1.5}, delivery={"claim_s": 2})
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

Value = str | int | float | bool


def _toml(value: Value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, ensure_ascii=False)  # a TOML basic string (JSON's escapes are TOML's)


def fakes_config(path: Path, *, telegram_fake: FakeTelegram, model_fake: FakeOpenAI, port: int,
                 db_url: str, mode: str = "webhook", top: dict[str, Value] | None = None,
                 **sections: dict[str, Value]) -> Path:
    """Writes ``path``: the database ``db_url``, HTTP on ``port``, the model and Telegram (``mode``
    ``webhook`` or ``polling``) at the fakes, keys from the environment the runs set
    (``FAULT_OPENAI_KEY``, ``FAULT_TELEGRAM_TOKEN``, ``FAULT_WEBHOOK_SECRET``), logs at WARNING;
    then ``top`` (top-level keys) and ``sections`` (``{"bus": {"lease_s": 5}}``) over that.
    Returns ``path``."""
    tables: dict[str, dict[str, Value]] = {
        "database": {"url": db_url},
        "http": {"port": port},
        "llm": {"base_url": f"{model_fake.url}/v1", "api_key_env": "FAULT_OPENAI_KEY", "max_retries": 0},
        "telegram": {"enabled": True, "mode": mode, "token_env": "FAULT_TELEGRAM_TOKEN", "base_url": telegram_fake.url,
                     **({"webhook_secret_env": "FAULT_WEBHOOK_SECRET"} if mode == "webhook" else {})},
        "logging": {"level": "WARNING"},
    }
    for name, keys in sections.items():
        tables[name] = {**tables.get(name, {}), **keys}
    lines = [f"{key} = {_toml(value)}" for key, value in (top or {}).items()]
    for name, keys in tables.items():
        lines += [f"[{name}]", *(f"{key} = {_toml(value)}" for key, value in keys.items())]
    path.write_text("\n".join(lines) + "\n")
    return path

