"""Builds the enabled adapters from the configuration (the one place that imports ``adapters``)."""

from __future__ import annotations

from gateway.config import GatewayConfig
from gateway.errors import ConfigError
from gateway.ports import Adapter


def build_adapters(config: GatewayConfig) -> list[Adapter]:
    """Adapters for every enabled platform.

    Raises:
        ConfigError: an enabled platform's secret is missing (names the variable) or the platform
            is not available yet.
    """
    adapters: list[Adapter] = []
    if config.telegram.enabled:
        from adapters.telegram.adapter import TelegramAdapter

        tg = config.telegram
        token = config.require_secret(tg.token_env, "telegram")
        secret = config.require_secret(tg.webhook_secret_env, "telegram webhook mode") if tg.mode == "webhook" else None
        adapters.append(TelegramAdapter(token=token, base_url=tg.base_url, mode=tg.mode, webhook_secret=secret,
                                        webhook_url=tg.webhook_url, poll_timeout_s=tg.poll_timeout_s))
    if config.slack.enabled:
        raise ConfigError("slack is enabled but the Slack adapter is not available in this version")
    if config.feishu.enabled:
        raise ConfigError("feishu is enabled but the Feishu adapter is not available in this version")
    return adapters
