"""Session keys: one pure function from a normalized message to the lane it belongs to (DESIGN §4).

DM -> the sender's conversation on that platform account; group -> the chat, and the
thread/topic when there is one.
"""

from __future__ import annotations

from gateway.types import InboundMessage


def session_key_for(message: InboundMessage) -> str:
    """Returns the session key string, e.g. ``telegram:7000000001:dm:5550001`` or
    ``telegram:7000000001:chat:-1001000000001:thread:77``."""
    address = message.address
    base = f"{address.platform}:{address.tenant}"
    if message.chat_type == "dm":
        return f"{base}:dm:{message.sender.user_id}"
    key = f"{base}:chat:{address.chat_id}"
    return f"{key}:thread:{address.thread_id}" if address.thread_id else key
