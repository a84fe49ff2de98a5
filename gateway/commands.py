"""Slash commands answered by the gateway itself, without the model.

Control commands (``/stop``) bypass the session's lane: they act while a turn is running.
"""

from __future__ import annotations

HELP = (
    "I am an AI assistant. Write to me in a DM, or mention me (or reply to me) in a group.\n"
    "Commands:\n"
    "/help - this message\n"
    "/stop - stop the answer in progress\n"
    '`/schedule "0 9 * * 1-5" Asia/Shanghai [--to slack:T123:C456] WHAT TO REPORT` - schedule a report\n'
    "/jobs - your scheduled reports; /run ID - fire one now; /unschedule ID - remove one"
)

CONTROL_COMMANDS = frozenset({"stop"})
"""Handled on receipt, outside the lane."""


def command_reply(command: str | None) -> str | None:
    """The gateway's own answer to ``/command`` run in the lane, or ``None`` when the agent should answer."""
    if command in ("start", "help"):
        return HELP
    return None


def control_reply(command: str, was_running: bool) -> str:
    """The answer to a control command."""
    if command == "stop":
        return "Stopped." if was_running else "Nothing is running; nothing to stop."
    raise ValueError(f"not a control command: {command}")
