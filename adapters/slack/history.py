"""Reading a thread back from Slack: ``conversations.replies`` pages -> ``ContextMessage`` values.

Slack Web API ``conversations.replies`` (docs.slack.dev/reference/methods/conversations.replies):
``channel`` and ``ts`` (the parent's) are required; the parent comes first, then the replies,
oldest first; ``latest`` (exclusive unless ``inclusive``) ends the range; ``limit`` per page (at
most 1000, 200 advised; non-Marketplace commercial apps since 2025: 15 and 1 request a minute);
pages chain through ``response_metadata.next_cursor`` while ``has_more`` is true. The bot token
needs the history scope of the conversation type (``channels:history``, ``groups:history``,
``im:history``, ``mpim:history``); without it Slack answers ``missing_scope`` with ``needed`` and
``provided``. Tier 3 (50+ a minute), so a thread is read once, when the bot first joins it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adapters.slack.inbound import _USER_MENTION, NEW_TEXT_SUBTYPES, BotIdentity, _attachment, plain_text
from gateway.core.types import ContextMessage

PAGE_LIMIT = 200
"""Messages asked per ``conversations.replies`` page (Slack advises no more than 200)."""
MAX_PAGES = 10
"""Pages read at most per thread (2,000 messages): the newest are kept, so a longer thread's
middle is left out."""


def authors(messages: list[dict[str, Any]], bot: BotIdentity) -> set[str]:
    """User ids whose names a thread's messages need: the authors and everyone mentioned."""
    found = {str(m["user"]) for m in messages if m.get("user")}
    for m in messages:
        found.update(_USER_MENTION.findall(str(m.get("text") or "")))
    found.discard(bot.user_id)
    return found


def context_message(message: Mapping[str, Any], channel: str, bot: BotIdentity,
                    names: Mapping[str, str]) -> ContextMessage | None:
    """One message of a ``conversations.replies`` answer as context, or ``None`` for what carries
    no user text (joins, deletions and other subtypes)."""
    subtype = message.get("subtype")
    if subtype not in NEW_TEXT_SUBTYPES and subtype != "bot_message":
        return None
    ts = str(message.get("ts") or "")
    if not ts:
        return None
    user = str(message.get("user") or "")
    profile = message.get("bot_profile") if isinstance(message.get("bot_profile"), dict) else {}
    from_bot = user == bot.user_id or bot.bot_id in (message.get("bot_id"), (profile or {}).get("id"))
    author = names.get(user) or str(message.get("username") or (profile or {}).get("name") or user)
    listed = message.get("files")
    files: list[Any] = listed if isinstance(listed, list) else []
    attachments = tuple(_attachment(f) for f in files if isinstance(f, dict) and f.get("id"))
    text = plain_text(str(message.get("text") or ""), bot.user_id, names)
    if not text and not attachments:
        return None
    try:
        sent_at = float(ts)
    except ValueError:
        sent_at = 0.0
    return ContextMessage(f"{channel}:{ts}", text, "" if from_bot else author, sent_at, attachments, from_bot)


def keep_newest(messages: list[ContextMessage], parent_id: str, limit: int) -> tuple[list[ContextMessage], int]:
    """The parent (when present) and the newest others, ``limit`` in all, oldest first; and how
    many were left out."""
    parent = [m for m in messages if m.message_id == parent_id][:1]
    rest = [m for m in messages if m.message_id != parent_id]
    room = max(limit - len(parent), 0)
    kept = (parent + (rest[-room:] if room else []))[:limit]
    return kept, len(messages) - len(kept)
