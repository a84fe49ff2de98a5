"""Group context: what was said in a group before the bot was mentioned there.

A group message not addressed to the bot (which otherwise starts nothing) is kept here when its
chat has group context on (``sessions.group_context_messages``, or a per-chat entry in
``sessions.group_context_chats``), and the next mention in that chat shows the last of them to the
model (``gateway.bus.conversation``). What is kept:

- only messages the bot itself received in that chat: the chat's own rows are read, by platform,
  tenant and chat id, so another group's messages never appear;
- cleaned and redacted like the inbox (``Inbound`` stores the message after ``storable_inbound``
  and the secret redaction), each text clipped to ``MAX_TEXT_CHARS``;
- at most the chat's count (the newest), and for at most ``sessions.group_context_hours``:
  ``record`` trims the chat at each insert and ``prune`` deletes what aged out everywhere.

Telegram delivers such messages only with privacy mode off (@BotFather ``/setprivacy``); Slack with
the ``message.channels`` (``message.groups``) subscription; Feishu with the "read all group
messages" permission.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from sqlalchemy import Engine, and_, delete, insert, or_, select
from sqlalchemy.exc import IntegrityError

from gateway.core.types import Attachment, ContextMessage, InboundMessage
from gateway.store.db import read_tx, write_tx
from gateway.store.models import GroupMessageRow, table
from gateway.store.sql import retry_locked

_rows = table(GroupMessageRow)

MAX_TEXT_CHARS = 4000
"""Longest text kept per message (what is shown is capped further by ``sessions.quote_max_chars``)."""


def _thread_matches(thread_id: str | None) -> Any:
    return _rows.c.thread_id.is_(None) if thread_id is None else _rows.c.thread_id == thread_id


def _attachment(data: dict[str, Any]) -> Attachment:
    known = {f.name for f in dataclasses.fields(Attachment)}
    return Attachment(**{k: v for k, v in data.items() if k in known})


class GroupContextStore:
    """The ``group_messages`` table: keep, read and expire group context. Blocking; call on the
    DB pool or a worker thread."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @retry_locked
    def record(self, message: InboundMessage, *, keep: int, max_age_s: float, now: float | None = None) -> bool:
        """Keeps ``message`` (already cleaned and redacted) as context of its chat and thread, then
        trims that chat to its newest ``keep`` rows and drops rows older than ``max_age_s``.

        Returns ``False`` when it was kept before (a platform's redelivery): nothing changes then.
        """
        now = time.time() if now is None else now
        address = message.address
        attachments = [dataclasses.asdict(a) for a in message.attachments]
        try:
            with write_tx(self.engine) as conn:
                conn.execute(insert(_rows).values(
                    platform=address.platform, tenant=address.tenant, chat_id=address.chat_id,
                    thread_id=address.thread_id, platform_message_id=message.message_id,
                    author=message.sender.display_name or message.sender.username or message.sender.user_id,
                    text=message.text[:MAX_TEXT_CHARS], attachments=attachments,
                    received_at=message.received_at, stored_at=now))
                chat = and_(_rows.c.platform == address.platform, _rows.c.tenant == address.tenant,
                            _rows.c.chat_id == address.chat_id)
                newest = (select(_rows.c.id).where(chat).order_by(_rows.c.received_at.desc(), _rows.c.id.desc())
                          .limit(max(keep, 0)).scalar_subquery())
                conn.execute(delete(_rows).where(chat, or_(_rows.c.id.not_in(newest),
                                                           _rows.c.stored_at < now - max_age_s)))
        except IntegrityError:
            return False
        return True

    def recent(self, *, platform: str, tenant: str, chat_id: str, thread_id: str | None, before: float,
               limit: int, max_age_s: float, exclude: frozenset[str] = frozenset(),
               now: float | None = None) -> list[ContextMessage]:
        """The newest ``limit`` kept messages of one chat and thread (``None``: its top level) sent at
        or before ``before`` (epoch s, the platform's time), kept less than ``max_age_s`` ago, and
        whose id is not in ``exclude``; oldest first."""
        if limit <= 0:
            return []
        now = time.time() if now is None else now
        query = (select(_rows.c.platform_message_id, _rows.c.author, _rows.c.text, _rows.c.attachments,
                        _rows.c.received_at)
                 .where(_rows.c.platform == platform, _rows.c.tenant == tenant, _rows.c.chat_id == chat_id,
                        _thread_matches(thread_id), _rows.c.received_at <= before,
                        _rows.c.stored_at >= now - max_age_s)
                 .order_by(_rows.c.received_at.desc(), _rows.c.id.desc()).limit(limit + len(exclude)))
        with read_tx(self.engine) as conn:
            rows = conn.execute(query).all()
        found = [ContextMessage(row.platform_message_id, row.text, row.author, row.received_at,
                                tuple(_attachment(a) for a in row.attachments or ()))
                 for row in rows if row.platform_message_id not in exclude][:limit]
        return found[::-1]

    @retry_locked
    def prune(self, *, max_age_s: float, now: float | None = None) -> int:
        """Deletes every kept message older than ``max_age_s`` (all chats); returns how many."""
        now = time.time() if now is None else now
        with write_tx(self.engine) as conn:
            return conn.execute(delete(_rows).where(_rows.c.stored_at < now - max_age_s)).rowcount or 0

    @retry_locked
    def forget_chat(self, platform: str, tenant: str, chat_id: str) -> int:
        """Deletes everything kept of one chat (the bot left it, or its group context was switched
        off); returns how many rows."""
        with write_tx(self.engine) as conn:
            return conn.execute(delete(_rows).where(_rows.c.platform == platform, _rows.c.tenant == tenant,
                                                    _rows.c.chat_id == chat_id)).rowcount or 0
