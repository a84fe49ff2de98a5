"""Slack slash commands, pure: the name table, a command payload -> ``InboundMessage``, and the
ephemeral reply target carried through the outbox.

Slack slash commands (docs.slack.dev "Implementing slash commands"): Slack POSTs a form-encoded
body (``command``, ``text``, ``user_id``, ``user_name``, ``channel_id``, ``channel_name``,
``team_id``, ``response_url``, ``trigger_id``, ``api_app_id``) to the Request URL, signed like every
Events API request, and needs a 2xx within 3 seconds (else the user sees ``operation_timeout``);
over Socket Mode the same fields are the payload of a ``slash_commands`` frame, acked by
``envelope_id``. The ``response_url`` takes up to 5 answers within 30 minutes, ``response_type:
"ephemeral"`` ones shown only to the user who typed the command; ``chat.postEphemeral`` does the
same where the bot is a member of the channel.

Command names are global per workspace: two apps cannot both own ``/new``. The table maps each
Slack name to a gateway command: every gateway command as ``/<prefix><name>`` (``prefix`` e.g.
``agent-``: ``/agent-new``; a ``-`` in what is typed also matches a ``_`` in the gateway's name),
plus explicit ``names`` (``{"/reset": "new"}``) that win over the prefix rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.core.types import ChatAddress, InboundMessage, Sender

EPHEMERAL_PREFIX = "ephemeral:"
"""``reply_to_id`` of a message whose answers go to one user only: ``ephemeral:<user id>`` and,
after one space, the command's ``response_url`` when it had one."""
MAX_RESPONSE_URL_CHARS = 200  # the outbox's reply_to_id holds 255 characters


@dataclass(frozen=True, slots=True)
class EphemeralTarget:
    """Who alone sees an answer (``user_id``), and the command's ``response_url`` (``None``: only
    ``chat.postEphemeral`` can answer)."""

    user_id: str
    response_url: str | None = None


def ephemeral_reply_to(user_id: str, response_url: str | None) -> str:
    """The ``reply_to_id`` that makes every answer to a message ephemeral (see ``EPHEMERAL_PREFIX``);
    a ``response_url`` too long for the outbox column, or not one URL, is left out."""
    url = response_url or ""
    keep = url and len(url) <= MAX_RESPONSE_URL_CHARS and not any(c.isspace() for c in url)
    return f"{EPHEMERAL_PREFIX}{user_id}" + (f" {url}" if keep else "")


def ephemeral_target(reply_to_id: str | None) -> EphemeralTarget | None:
    """The ephemeral target a ``reply_to_id`` names, or ``None`` for an ordinary reply."""
    if not reply_to_id or not reply_to_id.startswith(EPHEMERAL_PREFIX):
        return None
    user, _, url = reply_to_id[len(EPHEMERAL_PREFIX):].partition(" ")
    return EphemeralTarget(user, url or None) if user else None


class SlashCommands:
    """The Slack name -> gateway command table.

    Args:
        commands: the gateway's command names (``new``, ``status``, ``forget_files``...).
        prefix: put before every name in Slack (``agent-`` -> ``/agent-new``), ``""`` for none.
        names: explicit Slack name (with or without ``/``) -> gateway command; wins over the prefix.

    Raises:
        ValueError: an explicit name maps to a command the gateway does not have.
    """

    def __init__(self, commands: Iterable[str], prefix: str = "", names: Mapping[str, str] | None = None) -> None:
        self.commands = tuple(dict.fromkeys(commands))
        self.prefix = prefix.lower()
        known = set(self.commands)
        self._names: dict[str, str] = {}
        for slack_name, command in (names or {}).items():
            if command not in known:
                raise ValueError(f"slack command {slack_name!r} maps to unknown command {command!r}")
            self._names[slack_name.lower().removeprefix("/")] = command

    def slack_names(self) -> dict[str, str]:
        """Every Slack command (``/agent-new``) -> its gateway command, as the manifest declares them
        (the prefix rule for every command, then the explicit names)."""
        table = {f"/{self.prefix}{name}": name for name in self.commands}
        table.update({f"/{name}": command for name, command in self._names.items()})
        return table

    def rename(self, text: str) -> str:
        """``text`` with each gateway command it names (``/new``, ``/resume ID``) under its Slack name
        (``/agent-new``), so an answer such as ``/help`` names commands the user can type here.
        Unchanged without a prefix; a ``/word`` inside a path or URL (``a/new``) is left alone."""
        if not self.prefix:
            return text
        names = sorted(self.commands, key=len, reverse=True)
        pattern = re.compile(r"(?<![\w/.:-])/(" + "|".join(map(re.escape, names)) + r")(?![\w-])")
        return pattern.sub(lambda m: f"/{self.prefix}{m.group(1)}", text)

    def resolve(self, slack_command: str) -> str | None:
        """The gateway command for what Slack sent in ``command`` (``/agent-new`` -> ``new``), or
        ``None`` when it is none of ours."""
        name = slack_command.strip().lower().removeprefix("/")
        if name in self._names:
            return self._names[name]
        if not name.startswith(self.prefix):
            return None
        bare = name[len(self.prefix):]
        for candidate in (bare, bare.replace("-", "_")):
            if candidate in self.commands:
                return candidate
        return None


def command_to_inbound(body: Mapping[str, Any], table: SlashCommands, team_id: str) -> InboundMessage | str:
    """A slash command payload -> the command message it stands for, or the Slack command's name
    when the gateway has no such command. No I/O (``received_at`` is now).

    The message is what a typed ``/status`` would be (command ``status``, its arguments as the
    text) in the channel it was typed in, top level (Slack sends no thread for a slash command);
    ``chat_type`` is ``dm`` in a DM (``channel_id`` ``D…``). Its id is ``"<channel>:cmd:<trigger_id>"``
    (one per invocation: a Socket Mode redelivery is a duplicate in the inbox), and its
    ``reply_to_id`` makes every answer ephemeral (``ephemeral_reply_to``).
    """
    slack_command = str(body.get("command") or "")
    command = table.resolve(slack_command)
    if command is None:
        return slack_command
    user, channel = str(body.get("user_id") or ""), str(body.get("channel_id") or "")
    trigger = str(body.get("trigger_id") or "")
    return InboundMessage(
        address=ChatAddress("slack", str(body.get("team_id") or team_id), channel),
        message_id=f"{channel}:cmd:{trigger}",
        chat_type="dm" if channel.startswith("D") else "group",
        sender=Sender(user, str(body.get("user_name") or ""), None, False),
        text=str(body.get("text") or "").strip(),
        reply_to_id=ephemeral_reply_to(user, str(body.get("response_url") or "") or None),
        command=command,
        event_id=trigger or None,
    )
