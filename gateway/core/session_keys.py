"""Session keys: one pure function from a normalized message to the lane it belongs to (DESIGN §4).

- DM -> the sender's *user* (``dm:<user id>``): after ``/link`` the same conversation wherever
  they write, on any platform.
- Group -> the chat, and the thread/topic when there is one; with scope ``user``, each member
  of the chat gets a conversation of their own.
The reply always goes to the chat the message came from (``InboundMessage.address``); the key
only decides which conversation (history, lane) the message belongs to.
"""

from __future__ import annotations

from typing import Literal

from gateway.core.types import InboundMessage

GroupScope = Literal["chat", "user"]


def session_key_for(message: InboundMessage, user_id: str, group_scope: GroupScope = "chat") -> str:
    """Returns the session key, e.g. ``dm:3f2a…`` or
    ``telegram:7000000001:chat:-1001000000001:thread:77`` (``…:user:<user id>`` with scope ``user``).

    Args:
        message: the normalized message.
        user_id: the sender's user (identities resolved; linked accounts share it).
        group_scope: ``chat`` (one conversation per chat/thread) or ``user`` (per member).
    """
    if message.chat_type == "dm":
        return f"dm:{user_id}"
    address = message.address
    key = f"{address.platform}:{address.tenant}:chat:{address.chat_id}"
    if address.thread_id:
        key += f":thread:{address.thread_id}"
    return f"{key}:user:{user_id}" if group_scope == "user" else key


def is_dm_key(key: str) -> bool:
    """Whether ``key`` is a user's DM conversation (sessions there are owned by that user)."""
    return key.startswith("dm:")
