"""Conversation context: what a message replies to, the thread it was posted in, and what was said
in its group before, shown to the model with that message.

Computed once per user message, on the turn's worker thread before the first model call, and
stored in the message's ``meta["context"]`` (``gateway.bus.context.render_user`` renders it into
that message): the system prompt and tools stay byte-identical, later turns and replays send the
same bytes, and nothing is fetched again for a message already in the transcript. Three parts,
each optional:

- ``reply_to``: the replied-to message. Telegram sends it (``reply_to_message``, or the part the
  user selected: ``quote``); Slack (a thread's parent) and Feishu (``parent_id``) send only its id,
  so the adapter reads it (``ContextReader.read_message``). Not read again when the conversation
  already holds it, nor inside a thread the conversation follows (the model saw the thread).
- ``thread``: when the bot is mentioned inside a thread its conversation has never seen (a new
  session keyed by that thread), the thread's earlier messages (``ContextReader.read_thread``: Slack
  ``conversations.replies``, Feishu's message list of the thread), at most
  ``sessions.thread_context_messages`` and ``sessions.context_max_tokens``.
- ``group``: the chat's kept group context (``gateway.sessions.group_context``) up to the message,
  not yet shown in this conversation, at most the chat's ``group_context_messages`` and
  ``sessions.context_max_tokens``.

Everything fetched is cleaned (``storable_context``) and redacted like user text, each text capped
at ``sessions.quote_max_chars``, and rendered marked as quoted data, never instructions. A platform
that refuses (a missing scope, a rate limit) or is slow costs the turn that context, never the turn.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from agent.tokens import text_tokens
from gateway.core.config import SessionsConfig
from gateway.core.errors import ContextUnavailable
from gateway.core.ports import can_read_context
from gateway.core.types import ContextMessage, InboundMessage, ThreadHistory
from gateway.sessions.group_context import GroupContextStore
from gateway.store.sql import StoredMessage
from gateway.store.text import storable_context

log = logging.getLogger("gateway.bus.conversation")
T = TypeVar("T")

FETCH_TIMEOUT_S = 10.0
"""Longest wait for the platform's answer (all pages of a thread included) before the turn goes on
without that context."""
ENTRY_OVERHEAD_TOKENS = 8
"""Tokens counted per context message besides its text and author (time, separators)."""


def cap_text(text: str, max_chars: int) -> str:
    """``text`` within ``max_chars``: a longer one keeps its head and says how much was cut."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars].rstrip()} [… {len(text) - max_chars} more characters cut]"


def _entry(message: ContextMessage, max_chars: int) -> dict[str, Any]:
    """The stored (JSON) form of one context message; keys left out when empty."""
    entry: dict[str, Any] = {"id": message.message_id, "author": message.author, "time": message.sent_at,
                             "text": cap_text(message.text or "", max_chars)}
    if message.from_bot:
        entry["from_bot"] = True
    if message.partial:
        entry["partial"] = True
    if message.attachments:
        entry["attachments"] = [
            {"kind": a.kind, "file_id": a.file_id, "name": a.name, "mime_type": a.mime_type, "size": a.size}
            for a in message.attachments]
    return entry


def _tokens(entry: dict[str, Any]) -> int:
    return text_tokens(entry["text"]) + text_tokens(entry["author"]) + ENTRY_OVERHEAD_TOKENS


def fit(entries: list[dict[str, Any]], budget: int, keep_first: bool = False) -> tuple[list[dict[str, Any]], int]:
    """The newest ``entries`` (oldest first) whose tokens fit ``budget``, and how many were left out.
    With ``keep_first`` the first entry (a thread's parent) is kept before any other."""
    kept: list[dict[str, Any]] = []
    head = entries[:1] if keep_first else []
    used = sum(_tokens(e) for e in head)
    for entry in reversed(entries[len(head):]):
        cost = _tokens(entry)
        if used + cost > budget:
            break
        kept.append(entry)
        used += cost
    kept = head + kept[::-1]
    return kept, len(entries) - len(kept)


def shown_ids(window: Iterable[StoredMessage]) -> set[str]:
    """Platform message ids the conversation already holds: its user messages and every message
    shown as context with them."""
    seen: set[str] = set()
    for row in window:
        if row.role != "user":
            continue
        if row.platform_message_id:
            seen.add(row.platform_message_id)
        context = (row.meta or {}).get("context") or {}
        if context.get("reply_to"):
            seen.add(context["reply_to"]["id"])
        for part in ("thread", "group"):
            seen.update(entry["id"] for entry in (context.get(part) or {}).get("messages", ()))
    return seen


class ConversationContext:
    """Builds a user message's ``meta["context"]`` (see the module docstring).

    Args:
        adapters: the platform adapters by name; those with ``ContextReader`` can read messages.
        sessions: the ``[sessions]`` settings (caps, group context counts and age).
        group_context: the kept group messages (``None``: no group context).
        redact: removes configured secrets from fetched text before it is stored or shown.
    """

    def __init__(self, *, adapters: Mapping[str, object], sessions: SessionsConfig,
                 group_context: GroupContextStore | None, redact: Callable[[str], str] = lambda text: text) -> None:
        self.adapters = adapters
        self.sessions = sessions
        self.group_context = group_context
        self.redact = redact
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The main loop the adapters run on (``Gateway.start``); without it nothing is fetched."""
        self.loop = loop

    def annotate(self, meta: dict[str, Any], message: InboundMessage, *, window: Sequence[StoredMessage],
                 fresh: bool) -> dict[str, Any]:
        """``meta`` with ``"context"`` added when ``message`` has any (otherwise ``meta`` itself).

        Runs on the turn's worker thread (blocking: platform calls on the main loop, bounded by
        ``FETCH_TIMEOUT_S``; a DB read for group context).

        Args:
            window: the conversation's loaded transcript (what the model already saw).
            fresh: the conversation has nothing before this turn (no message, no summary): a
                thread it is keyed by has never been seen.
        """
        sessions = self.sessions
        chars = sessions.quote_max_chars
        seen = shown_ids(window)
        seen.add(message.message_id)
        adapter = self.adapters.get(message.platform)
        reader: Any = adapter if adapter is not None and can_read_context(adapter) else None
        in_thread = message.chat_type != "dm" and bool(message.address.thread_id) and not message.opens_thread
        context: dict[str, Any] = {}

        thread: list[ContextMessage] = []
        history = None
        if in_thread and fresh and reader is not None and sessions.thread_context_messages > 0:
            history = self._fetch("thread", message, reader.read_thread(message, sessions.thread_context_messages))
            if history is not None:
                thread = [self._clean(m) for m in history.messages if m.message_id not in seen]
        if thread and history is not None:
            entries, left_out = fit([_entry(m, chars) for m in thread], sessions.context_max_tokens, keep_first=True)
            context["thread"] = {"messages": entries, "left_out": left_out + history.omitted,
                                 "unread": history.unread}
            seen.update(m.message_id for m in thread)

        quoted = message.quoted
        if quoted is not None and quoted.text is None:
            follows_thread = in_thread and not fresh  # the model has seen that thread
            if quoted.message_id in seen or follows_thread or reader is None:
                quoted = None
            else:
                fetched = self._fetch("replied-to message", message, reader.read_message(message))
                quoted = self._clean(fetched) if fetched is not None and fetched.text is not None else None
        if quoted is not None and (quoted.text or quoted.attachments):
            context["reply_to"] = _entry(quoted, chars)
            seen.add(quoted.message_id)

        count = sessions.group_context_for(message.platform, message.address.chat_id)
        if self.group_context is not None and message.chat_type != "dm" and count > 0:
            kept = self.group_context.recent(
                platform=message.platform, tenant=message.address.tenant, chat_id=message.address.chat_id,
                thread_id=None if message.opens_thread else message.address.thread_id,
                before=message.received_at, limit=count, max_age_s=sessions.group_context_hours * 3600,
                exclude=frozenset(seen))
            if kept:
                entries, left_out = fit([_entry(m, chars) for m in kept], sessions.context_max_tokens)
                if entries:
                    context["group"] = {"messages": entries, "left_out": left_out}
        return {**meta, "context": context} if context else meta

    def _clean(self, message: ContextMessage) -> ContextMessage:
        cleaned = storable_context(message)
        if cleaned.text:
            cleaned = ContextMessage(cleaned.message_id, self.redact(cleaned.text), cleaned.author, cleaned.sent_at,
                                     cleaned.attachments, cleaned.from_bot, cleaned.partial)
        return cleaned

    def _fetch(self, what: str, message: InboundMessage, call: Awaitable[T]) -> T | None:
        """Runs an adapter coroutine on the main loop and waits for it (``None`` on any failure,
        logged: the turn goes on without that context)."""
        if self.loop is None or self.loop.is_closed():
            _close(call)
            return None
        future = asyncio.run_coroutine_threadsafe(_awaited(call), self.loop)
        try:
            return future.result(FETCH_TIMEOUT_S)
        except ContextUnavailable as exc:
            log.warning("%s: %s of %s not read: %s", message.platform, what, message.message_id, exc)
        except TimeoutError:
            future.cancel()
            log.warning("%s: %s of %s not read: no answer within %.0f s", message.platform, what,
                        message.message_id, FETCH_TIMEOUT_S)
        except Exception as exc:
            log.warning("%s: %s of %s not read (%s: %s)", message.platform, what, message.message_id,
                        type(exc).__name__, exc)
        return None


async def _awaited(call: Awaitable[T]) -> T:
    return await call


def _close(call: Awaitable[Any]) -> None:
    close = getattr(call, "close", None)
    if callable(close):
        close()  # a coroutine never awaited: closed, so Python does not warn about it


__all__ = ["ConversationContext", "ThreadHistory", "cap_text", "fit", "shown_ids"]
