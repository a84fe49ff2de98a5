"""``TranscriptReader``: the ``ConversationReader`` the web chat reads its conversation through.

A platform user -> their user (identities resolved, so a linked account finds the shared user) ->
their DM session key ``dm:<user id>`` -> the lane's current session -> its user and assistant
messages (tool calls and tool results are left out; the admin transcript shows them). Each turn's
platform is read from its inbox row (turn id ``in<inbox id>``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Engine, Text, and_, cast, or_, select

from gateway.store.db import read_tx
from gateway.store.models import IdentityRow, InboxRow, LaneRow, MessageRow, table

_identities = table(IdentityRow)
_inbox = table(InboxRow)
_lanes = table(LaneRow)
_messages = table(MessageRow)

RunDb = Callable[..., Awaitable[Any]]


class TranscriptReader:
    """Implements ``gateway.core.ports.ConversationReader`` on one engine.

    Args:
        engine: the gateway's database.
        run_db: runs a blocking call off the main loop (``Gateway.run_db``).
    """

    def __init__(self, engine: Engine, run_db: RunDb) -> None:
        self.engine = engine
        self._run_db = run_db

    async def read(self, platform: str, tenant: str, platform_user_id: str, after_id: int,
                   limit: int = 200) -> tuple[str | None, list[dict[str, Any]]]:
        """See ``ConversationReader.read``."""
        result: tuple[str | None, list[dict[str, Any]]] = await self._run_db(
            self.read_now, platform, tenant, platform_user_id, after_id, limit)
        return result

    def read_now(self, platform: str, tenant: str, platform_user_id: str, after_id: int,
                 limit: int = 200) -> tuple[str | None, list[dict[str, Any]]]:
        """``read`` as a blocking call (worker threads, tests)."""
        with read_tx(self.engine) as conn:
            user_id = conn.execute(select(_identities.c.user_id).where(and_(
                _identities.c.platform == platform, _identities.c.tenant == tenant,
                _identities.c.platform_user_id == platform_user_id))).scalar()
            if user_id is None:
                return None, []
            session_id = conn.execute(select(_lanes.c.session_id).where(_lanes.c.key == f"dm:{user_id}")).scalar()
            if session_id is None:
                return None, []
            rows = conn.execute(
                select(_messages.c.id, _messages.c.turn_id, _messages.c.role, _messages.c.content,
                       _messages.c.created_at, _messages.c.platform_message_id, _messages.c.meta)
                .where(_messages.c.session_id == session_id, _messages.c.id > after_id,
                       _messages.c.role.in_(("user", "assistant")),
                       # not an assistant message that only called tools (an answer that is only files is shown)
                       or_(and_(_messages.c.content.is_not(None), _messages.c.content != ""),
                           _messages.c.role == "user",
                           cast(_messages.c.meta, Text).contains('"attachments"')))
                .order_by(_messages.c.id).limit(limit)).all()
            inbox_ids = {inbox_id_of(r.turn_id) for r in rows} - {None}
            platforms = dict(conn.execute(select(_inbox.c.id, _inbox.c.platform)
                                          .where(_inbox.c.id.in_(inbox_ids))).all()) if inbox_ids else {}
        return str(session_id), [
            {"id": int(r.id), "role": r.role, "text": r.content or "",
             "platform": platforms.get(inbox_id_of(r.turn_id)),
             "message_id": r.platform_message_id, "created_at": float(r.created_at),
             "attachments": [a for a in (r.meta or {}).get("attachments", ()) if isinstance(a, dict)]}
            for r in rows if r.content or (r.meta or {}).get("attachments")]


def inbox_id_of(turn_id: str | None) -> int | None:
    """The inbox row behind a chat turn's id (``in<inbox id>``, ``gateway.bus.turns``); ``None`` for
    other turns (scheduled runs)."""
    if turn_id and turn_id.startswith("in") and turn_id[2:].isdigit():
        return int(turn_id[2:])
    return None
