"""Builds the enabled adapters from the configuration (with `gateway chat`'s local adapter in `cli`, the
only places that import ``adapters``)."""

from __future__ import annotations

import dataclasses

from gateway.core.config import GatewayConfig
from gateway.core.errors import ConfigError
from gateway.core.i18n import LOCALES, language_code
from gateway.core.ports import Adapter
from gateway.sessions.commands import MENU, command_menu


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
                                        webhook_url=tg.webhook_url, poll_timeout_s=tg.poll_timeout_s,
                                        menu=_telegram_menu(config),
                                        group_context=config.sessions.group_context_on("telegram"),
                                        max_download_bytes=tg.download_limit_bytes(), local_mode=tg.local_mode,
                                        max_upload_bytes=tg.upload_limit_bytes()))
    if config.slack.enabled:
        from adapters.slack.adapter import SlackAdapter

        sl = config.slack
        bot_token = config.require_secret(sl.bot_token_env, "slack")
        events, socket = sl.mode == "events", sl.mode == "socket"
        signing_secret = config.require_secret(sl.signing_secret_env, "slack events mode") if events else None
        app_token = config.require_secret(sl.app_token_env, "slack socket mode") if socket else None
        adapters.append(SlackAdapter(bot_token=bot_token, signing_secret=signing_secret, app_token=app_token,
                                     mode=sl.mode, api_url=sl.api_url,
                                     group_context=config.sessions.group_context_on("slack"),
                                     slash_commands=slack_commands(config), assistant=sl.assistant,
                                     suggested_prompts=tuple(sl.suggested_prompts),
                                     native_streaming=sl.native_streaming))
    if config.feishu.enabled:
        from adapters.feishu.adapter import FeishuAdapter

        fs = config.feishu
        app_id = config.require_secret(fs.app_id_env, "feishu")
        app_secret = config.require_secret(fs.app_secret_env, "feishu")
        verification_token: str | None
        if fs.mode == "webhook":
            verification_token = config.require_secret(fs.verification_token_env, "feishu webhook mode")
        else:
            verification_token = config.secret(fs.verification_token_env)
        try:
            adapters.append(FeishuAdapter(app_id=app_id, app_secret=app_secret, verification_token=verification_token,
                                          encrypt_key=config.secret(fs.encrypt_key_env), mode=fs.mode,
                                          domain=fs.domain,
                                          group_context=config.sessions.group_context_on("feishu")))
        except ValueError as exc:  # lark-oapi rejects the domain (https only, http for loopback)
            raise ConfigError(f"feishu.domain is invalid: {exc}") from None
    if config.web.enabled:
        from adapters.web.adapter import WebAdapter

        adapters.append(WebAdapter(secret=config.web_secret(), cookie_secure=config.web.cookie_secure,
                                   uploads_per_hour=config.web.uploads_per_hour,
                                   upload_mb_per_hour=config.web.upload_mb_per_hour,
                                   streams_per_address=config.web.streams_per_address,
                                   max_streams=config.web.max_streams, proxies=config.http.proxies()))
    return adapters


def slack_commands(config: GatewayConfig):  # -> adapters.slack.commands.SlashCommands
    """The Slack slash command table: every command of the menu as ``/<slack.command_prefix><name>``,
    plus ``slack.command_names``.

    Raises:
        ConfigError: ``slack.command_names`` maps to a command the gateway does not have.
    """
    from adapters.slack.commands import SlashCommands

    try:
        return SlashCommands([name for name, _, _ in MENU], config.slack.command_prefix, config.slack.command_names)
    except ValueError as exc:
        raise ConfigError(f"slack.command_names: {exc}") from None


def slack_manifest(config: GatewayConfig, request_url: str) -> dict:
    """The Slack app manifest for this configuration (``adapters.slack.manifest``): the slash
    commands under their Slack names with the menu's descriptions, the mode, the suggested prompts.

    Raises:
        ConfigError: as ``slack_commands``.
    """
    from adapters.slack.manifest import build_manifest

    described = {name: text for name, text, _ in MENU}
    commands = [(slack_name, command, described[command])
                for slack_name, command in slack_commands(config).slack_names().items()]
    return build_manifest(commands, mode=config.slack.mode, request_url=request_url,
                          prompts=config.slack.suggested_prompts)


def _telegram_menu(config: GatewayConfig):  # -> adapters.telegram.adapter.CommandMenu
    """The Telegram command menus: DM and group commands; the admin menu (pairing approval) in the
    DMs of ``access.admins``' Telegram accounts, only where pairing is in use (allowlist mode). The
    menus without a language are in ``i18n.default``; each catalog's language has its own (Bot API
    setMyCommands ``language_code``: clients whose language is ``zh`` show the Chinese ones)."""
    from adapters.telegram.adapter import CommandMenu

    access = config.access
    admin_ids = [int(entry.split(":", 1)[1]) for entry in access.admins
                 if entry.startswith("telegram:") and entry.split(":", 1)[1].lstrip("-").isdigit()]
    pairing = access.mode == "allowlist" and access.pairing

    def menu(locale: str) -> CommandMenu:
        return CommandMenu(private=command_menu("dm", locale), groups=command_menu("group", locale),
                           admins=command_menu("admin", locale) if pairing else (),
                           admin_chat_ids=admin_ids if pairing else ())

    default = menu(config.i18n.default)
    return dataclasses.replace(default, languages={language_code(locale): menu(locale) for locale in LOCALES})
