"""Access control (DESIGN §4): who may talk to the agent. Pure: decisions from config and facts.

Entries are ``platform:id`` strings: users ``telegram:5550001``, ``slack:U0123``, ``feishu:ou_…``;
chats ``telegram:-1001000000001``, ``slack:C0123``, ``feishu:oc_…``.
"""

from __future__ import annotations

from typing import Literal

from gateway.core.config import AccessConfig, GatewayConfig
from gateway.core.types import InboundMessage

Decision = Literal["allow", "pair", "deny"]


def user_entry(message: InboundMessage) -> str:
    return f"{message.platform}:{message.sender.user_id}"


def chat_entry(message: InboundMessage) -> str:
    return f"{message.platform}:{message.address.chat_id}"


def is_admin(message: InboundMessage, access: AccessConfig) -> bool:
    return user_entry(message) in access.admins


def decide(message: InboundMessage, approved: bool, access: AccessConfig) -> Decision:
    """``allow``; ``pair`` (an unknown user in a DM: answer with a pairing code, no model call);
    ``deny`` (ignore silently: an unknown chat or user in a group).

    Mode ``open`` allows everyone. Mode ``allowlist`` allows admins, listed users, users approved
    by pairing, and anyone in a listed chat.
    """
    if access.mode == "open":
        return "allow"
    if (is_admin(message, access) or approved or user_entry(message) in access.allowed_users
            or chat_entry(message) in access.allowed_chats):
        return "allow"
    if message.chat_type == "dm" and access.pairing:
        return "pair"
    return "deny"


def admin_pages_on(config: GatewayConfig) -> bool:
    """The admin pages are served (web chat on and its admin password set): an admin can decide
    approvals there."""
    return config.web.enabled and config.secret(config.web.admin_password_env) is not None


def may_run_guarded_tools(message: InboundMessage, approved: bool, access: AccessConfig) -> bool:
    """Whether the sender may decide their own approval requests for tools that need approval
    (``run_shell``, ``write_file``, browser clicks, MCP tools with side effects...).

    Mode ``allowlist``: everyone allowed to talk (the allowlist already vetted them). Mode
    ``open``: only admins, ``access.allowed_users`` and users approved by pairing; a stranger's
    call of such a tool waits for an admin's approval (``gateway.tools.approvals``).
    """
    if access.mode != "open":
        return True
    return is_admin(message, access) or approved or user_entry(message) in access.allowed_users
