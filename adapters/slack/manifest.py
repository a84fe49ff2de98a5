"""The Slack app manifest the gateway needs (Slack "App manifest reference": ``display_information``,
``features`` with ``bot_user``, ``app_home``, ``assistant_view`` and ``slash_commands``,
``oauth_config.scopes.bot``, ``settings`` with ``event_subscriptions``, ``interactivity`` and
``socket_mode_enabled``). ``deploy/slack-manifest.yaml`` is this for the default configuration;
``gateway slack-manifest`` prints it for yours (command prefix, mode, URL). Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

BOT_SCOPES: tuple[str, ...] = (
    "app_mentions:read",  # app_mention events
    "assistant:write",  # assistant.threads.setSuggestedPrompts (and setStatus, which also takes chat:write)
    "channels:history",  # message.channels events, conversations.replies in public channels
    "chat:write",  # chat.postMessage / update / postEphemeral, chat.startStream / appendStream / stopStream
    "commands",  # slash commands
    "files:read",  # downloading the files users share
    "files:write",  # files upload v2 (send_file)
    "groups:history",  # private channels
    "im:history",  # message.im events, DM threads
    "mpim:history",  # group DMs
    "reactions:write",  # the "working on it" reaction
    "users:read",  # users.info: display names of authors and mentions
)
"""Every bot token scope the adapter's calls and events need."""

BOT_EVENTS: tuple[str, ...] = (
    "app_mention", "assistant_thread_context_changed", "assistant_thread_started", "channel_left", "group_left",
    "message.channels", "message.groups", "message.im", "message.mpim",
)
"""The bot events the adapter listens to (every other event it gets is acked and ignored)."""


def split_usage(name: str, description: str) -> tuple[str, str]:
    """A menu description split into what the command does and what follows it (Slack's
    ``usage_hint``): ``"Continue a conversation: /resume ID"`` -> ``("Continue a conversation", "ID")``,
    ``"This chat's model (admins: /model NAME)"`` -> ``("This chat's model (admins)", "NAME")``,
    ``"Start a fresh conversation"`` -> (unchanged, ``""``)."""
    aside = re.fullmatch(rf"(.*?)\s*\(([^()]*?):\s*/{re.escape(name)} ([^()]+)\)", description)
    if aside:
        return f"{aside[1]} ({aside[2]})", aside[3].strip()
    marker = f": /{name} "
    if marker in description:
        head, hint = description.split(marker, 1)
        return head, hint.strip()
    return description, ""


def usage_hint(name: str, description: str) -> str:
    """What follows the command in its menu description (``split_usage``), ``""`` when nothing."""
    return split_usage(name, description)[1]


def build_manifest(commands: Iterable[tuple[str, str, str]], *, mode: str, request_url: str,
                   prompts: Iterable[str] = (), name: str = "Agent Gateway") -> dict[str, Any]:
    """The manifest as a dict (dump it as YAML or JSON).

    Args:
        commands: ``(slack command, gateway command, description)``, e.g.
            ``("/agent-new", "new", "Start a fresh conversation")``.
        mode: ``events`` (Slack POSTs to ``request_url``: events, interactivity, commands) or
            ``socket`` (Socket Mode: no URLs).
        request_url: the public ``https://…/slack/events`` (ignored in socket mode).
        prompts: the assistant view's suggested prompts (each the title and the message).
        name: the app's and bot user's name.
    """
    events = mode == "events"
    slash = []
    for slack_name, command, description in commands:
        said, hint = split_usage(command, description)
        entry: dict[str, Any] = {"command": slack_name, "description": said[:2000], "should_escape": False}
        if hint:
            entry["usage_hint"] = hint
        if events:
            entry["url"] = request_url
        slash.append(entry)
    settings: dict[str, Any] = {
        "event_subscriptions": {"bot_events": list(BOT_EVENTS)},
        "interactivity": {"is_enabled": True},
        "org_deploy_enabled": False,
        "socket_mode_enabled": not events,
        "token_rotation_enabled": False,
    }
    if events:
        settings["event_subscriptions"]["request_url"] = request_url
        settings["interactivity"]["request_url"] = request_url
    return {
        "_metadata": {"major_version": 1, "minor_version": 1},
        "display_information": {"name": name, "description": "An LLM agent in Slack, Telegram, Feishu and the web"},
        "features": {
            "app_home": {"home_tab_enabled": False, "messages_tab_enabled": True,
                         "messages_tab_read_only_enabled": False},
            "bot_user": {"display_name": name, "always_online": True},
            "assistant_view": {"assistant_description": "An LLM agent: ask it anything, in this view or in a DM.",
                               "suggested_prompts": [{"title": p[:75], "message": p} for p in prompts]},
            "slash_commands": slash,
        },
        "oauth_config": {"scopes": {"bot": list(BOT_SCOPES)}},
        "settings": settings,
    }
