"""Config contract (DESIGN §10) and the deterministic context projection (DESIGN §5)."""

from __future__ import annotations

import pytest

from gateway.app.wiring import build_adapters
from gateway.bus.context import INTERRUPTED, render_history
from gateway.core.config import load_config
from gateway.core.errors import ConfigError
from gateway.core.session_keys import session_key_for
from gateway.core.types import ChatAddress, InboundMessage, Sender
from gateway.ops.logs import RedactSecrets
from gateway.store.sql import StoredMessage


def test_toml_then_env_overrides(tmp_path, monkeypatch):
    path = tmp_path / "g.toml"
    path.write_text('[llm]\nmodel = "from-file"\nbase_url = "http://127.0.0.1:1/v1"\n[http]\nport = 9000\n')
    monkeypatch.setenv("GATEWAY__LLM__MODEL", "from-env")
    config = load_config(path)
    assert config.llm.model == "from-env" and config.llm.base_url == "http://127.0.0.1:1/v1"
    assert config.http.port == 9000 and config.database.url == "sqlite:///./data/gateway.db"


def test_unknown_keys_and_missing_files_are_clear_errors(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text("[telegram]\ntokn_env = 'X'\n")
    with pytest.raises(ConfigError, match=r"telegram\.tokn_env"):
        load_config(path)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")


def test_enabled_platform_without_token_names_the_variable(monkeypatch):
    monkeypatch.delenv("MY_TG_TOKEN", raising=False)
    config = load_config(None, telegram={"enabled": True, "token_env": "MY_TG_TOKEN"})
    with pytest.raises(ConfigError, match="MY_TG_TOKEN"):
        build_adapters(config)


def test_example_config_loads():
    from pathlib import Path

    config = load_config(Path(__file__).resolve().parents[1] / "deploy" / "gateway.example.toml")
    assert config.telegram.token_env == "TELEGRAM_BOT_TOKEN"


def test_secrets_are_redacted_from_log_records():
    import logging

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "POST %s failed for key %s",
                               ("https://api.telegram.org/bot7000000001:AAFakeTokenForLoopbackTestsOnly0000/getMe",
                                "sk-live-secret-value"), None)
    RedactSecrets(["sk-live-secret-value"]).filter(record)
    assert "AAFake" not in record.getMessage() and "sk-live" not in record.getMessage()


@pytest.mark.parametrize(("platform", "chat_type", "thread", "user", "scope", "expected"), [
    ("telegram", "dm", None, "u1", "chat", "dm:u1"),
    ("slack", "dm", None, "u1", "chat", "dm:u1"),  # a linked user: the same conversation anywhere
    ("feishu", "dm", "omt_9", "u1", "chat", "dm:u1"),  # a DM thread stays the user's conversation
    ("telegram", "group", None, "u1", "chat", "telegram:1:chat:-100"),
    ("telegram", "group", "77", "u1", "chat", "telegram:1:chat:-100:thread:77"),  # forum topic
    ("slack", "group", "1735.0001", "u2", "chat", "slack:1:chat:-100:thread:1735.0001"),  # thread
    ("telegram", "group", None, "u1", "user", "telegram:1:chat:-100:user:u1"),  # per-user scope
    ("telegram", "group", "77", "u2", "user", "telegram:1:chat:-100:thread:77:user:u2"),
])
def test_session_keys(platform, chat_type, thread, user, scope, expected):
    chat = "42" if chat_type == "dm" else "-100"
    msg = InboundMessage(ChatAddress(platform, "1", chat, thread), "m", chat_type, Sender("42"), "hi")
    assert session_key_for(msg, user, scope) == expected


def row(i, role, content=None, tool_calls=None, tool_call_id=None, meta=None):
    return StoredMessage(i, "t", role, content, tool_calls, tool_call_id, None, meta)


def test_history_starts_at_a_user_message_and_closes_interrupted_calls():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    window = [
        row(1, "tool", "orphan", tool_call_id="c0"),
        row(2, "assistant", "cut-off answer"),
        row(3, "user", "q1", meta={"time": 0}),
        row(4, "assistant", None, tool_calls=[call]),
        row(5, "user", "q2", meta={"time": 60, "from": "Bob"}),
    ]
    out = render_history(window)
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "user"]
    assert out[0]["content"] == "[1970-01-01 00:00 UTC]\nq1"
    assert out[2] == {"role": "tool", "tool_call_id": "c1", "content": INTERRUPTED}
    assert out[3]["content"] == "[1970-01-01 00:01 UTC, from Bob]\nq2"
    assert render_history(window) == out  # deterministic bytes


def test_an_answer_stored_without_text_or_calls_is_sent_as_the_api_takes_it(fake_openai):
    # Rows an empty model answer left with content NULL (written before the loop stored "") made
    # every later request of the session a 400: the API takes null content only beside tool calls.
    from agent.model import OpenAIChatModel
    from tests.fakes import openai as oa

    fake_openai.reset()
    fake_openai.script(oa.text("answered"))
    window = [row(1, "user", "q1", meta={"time": 0}), row(2, "assistant", None), row(3, "user", "q2")]
    history = render_history(window)
    model = OpenAIChatModel(base_url=f"{fake_openai.url}/v1", api_key="sk-test", model="gpt-4o-mini", max_retries=0)
    assert model.complete([{"role": "system", "content": "s"}, *history], []).content == "answered"
    assert history[1] == {"role": "assistant", "content": ""}


def test_context_window_settings_are_checked():
    from gateway.core.config import LlmConfig

    policy = LlmConfig(context_window_tokens=8000, compress_threshold=0.6).window_policy()
    assert policy.compress_at == 4800 and policy.hard_limit == 7200
    with pytest.raises(ValueError):
        LlmConfig(compress_threshold=0.95)


def test_a_typo_in_an_environment_override_or_a_chat_rules_platform_is_an_error(monkeypatch):
    """``GATEWAY__NOSUCH__KEY`` names no section and ``platform = "slak"`` no platform: both would
    otherwise be ignored silently (the README promises unknown keys are errors)."""
    monkeypatch.setenv("GATEWAY__NOSUCH__KEY", "1")
    with pytest.raises(ConfigError, match="unknown setting in the environment: GATEWAY__NOSUCH__KEY"):
        load_config(None)
    monkeypatch.delenv("GATEWAY__NOSUCH__KEY")
    monkeypatch.setenv("GATEWAY__HTTP__PORT", "8123")  # a real section still works
    assert load_config(None).http.port == 8123
    with pytest.raises(ConfigError, match=r"chats\.0\.platform"):
        load_config(None, chats=[{"platform": "slak", "persona": "terse"}])


def test_ssl_cert_file_or_dir_naming_nothing_is_a_clear_error(monkeypatch, tmp_path):
    """A CA location in the environment that does not exist stops the start with one line naming
    it (every HTTPS client would fail to build, with a bare ``FileNotFoundError``); a bundle that
    exists but holds no certificates makes the model's client fail naming the variable."""
    import agent.model

    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match=r"SSL_CERT_FILE=.*missing\.pem names no file"):
        load_config(None)
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"SSL_CERT_DIR=.*nowhere names no directory"):
        load_config(None)
    monkeypatch.delenv("SSL_CERT_DIR")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(garbage))
    monkeypatch.setattr(agent.model, "_tls", None)
    with pytest.raises(ValueError, match=r"could not be loaded from SSL_CERT_FILE=.*garbage\.pem"):
        agent.model.shared_tls_context()
