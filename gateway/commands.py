"""Slash commands answered by the gateway itself, without the model."""

from __future__ import annotations

HELP = (
    "I am an AI assistant. Write to me in a DM, or mention me (or reply to me) in a group.\n"
    "Commands:\n"
    "/help - this message"
)


def command_reply(command: str | None) -> str | None:
    """The gateway's own answer to ``/command``, or ``None`` when the agent should answer."""
    if command in ("start", "help"):
        return HELP
    return None
