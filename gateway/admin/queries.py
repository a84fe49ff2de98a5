"""Read-only queries behind the admin pages (sessions, transcripts, users, approvals).

Blocking calls on the gateway's engine: run them through ``Gateway.run_db``. Rows come back as
plain dicts for the templates; times are epoch seconds.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Engine, func, or_, select

from gateway.sessions.conversations import inbox_id_of
from gateway.sessions.directory import usage_sums
from gateway.store.db import read_tx
from gateway.store.models import ApprovalRow, IdentityRow, InboxRow, MessageRow, SessionRow, UserRow, table

_sessions = table(SessionRow)
_messages = table(MessageRow)
_users = table(UserRow)
_identities = table(IdentityRow)
_approvals = table(ApprovalRow)
_inbox = table(InboxRow)

PAGE_ROWS = 100


class AdminQueries:
    """The admin pages' reads on one engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def sessions(self, query: str = "", limit: int = PAGE_ROWS) -> list[dict[str, Any]]:
        """Sessions, most recently updated first, with message and token counts (``cached_tokens``
        of the prompt tokens served from cache) and the recorded ``cost_usd``. ``query`` matches
        a session id prefix, a key or title substring, or any message's text (case-insensitive)."""
        prompt, completion, cached, cost = usage_sums()
        stats = (select(_messages.c.session_id, func.count().label("messages"), prompt.label("prompt_tokens"),
                        completion.label("completion_tokens"), cached.label("cached_tokens"),
                        cost.label("cost_usd"), func.max(_messages.c.created_at).label("last_at"))
                 .group_by(_messages.c.session_id).subquery())
        statement = (select(_sessions.c.id, _sessions.c.key, _sessions.c.title, _sessions.c.owner_user_id,
                            _sessions.c.created_at, stats.c.messages, stats.c.prompt_tokens,
                            stats.c.completion_tokens, stats.c.cached_tokens, stats.c.cost_usd, stats.c.last_at)
                     .select_from(_sessions.outerjoin(stats, stats.c.session_id == _sessions.c.id)))
        query = query.strip()
        if query:
            matching = select(_messages.c.session_id).where(_messages.c.content.icontains(query, autoescape=True))
            statement = statement.where(or_(_sessions.c.id.startswith(query.lower(), autoescape=True),
                                            _sessions.c.key.icontains(query, autoescape=True),
                                            _sessions.c.title.icontains(query, autoescape=True),
                                            _sessions.c.id.in_(matching)))
        statement = statement.order_by(func.coalesce(stats.c.last_at, _sessions.c.created_at).desc()).limit(limit)
        with read_tx(self.engine) as conn:
            rows = [dict(r._mapping) for r in conn.execute(statement).all()]
            for row in rows:  # a first turn that called tools leaves the title unset: show its message
                if not row["title"]:
                    first = conn.execute(select(_messages.c.content).where(
                        _messages.c.session_id == row["id"], _messages.c.role == "user")
                        .order_by(_messages.c.id).limit(1)).scalar()
                    row["title"] = " ".join((first or "").split())[:80] or None
        return rows

    def session(self, session_id: str) -> dict[str, Any] | None:
        """One session with its transcript grouped into turns, or ``None``.

        Shape: the session's columns plus ``turns``: a list of ``{"turn_id", "platform",
        "messages", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd"}`` (sums of
        what each of the turn's model calls reported, once per call, and of its recorded cost);
        each message has ``role``, ``content``, ``calls`` (``[{"id", "name", "arguments"}]``,
        arguments pretty-printed), ``tool_call_id``, ``tool_name`` (for a tool result: the called
        tool's name), token counts (``cached_tokens`` too), ``answered_by`` (``provider:model`` of a
        routed answer, else ``None``), ``files`` (the message's file references; an assistant
        message's are the files it sent) and ``created_at``.
        """
        with read_tx(self.engine) as conn:
            row = conn.execute(select(_sessions).where(_sessions.c.id == session_id)).first()
            if row is None:
                return None
            rows = conn.execute(select(_messages).where(_messages.c.session_id == session_id)
                                .order_by(_messages.c.id)).all()
            inbox_ids = {inbox_id_of(r.turn_id) for r in rows} - {None}
            platforms = dict(conn.execute(select(_inbox.c.id, _inbox.c.platform)
                                          .where(_inbox.c.id.in_(inbox_ids))).all()) if inbox_ids else {}
        names: dict[str, str] = {}
        turns: list[dict[str, Any]] = []
        for r in rows:
            if not turns or turns[-1]["turn_id"] != r.turn_id:
                turns.append({"turn_id": r.turn_id, "platform": platforms.get(inbox_id_of(r.turn_id)),
                              "messages": [], "prompt_tokens": 0, "completion_tokens": 0,
                              "cached_tokens": 0, "cost_usd": 0.0})
            turn = turns[-1]
            meta = r.meta if isinstance(r.meta, dict) else {}
            calls = []
            for call in r.tool_calls or []:
                function = call.get("function", {})
                names[call.get("id", "")] = function.get("name", "?")
                calls.append({"id": call.get("id"), "name": function.get("name", "?"),
                              "arguments": _pretty(function.get("arguments", ""))})
            turn["messages"].append({"id": r.id, "role": r.role, "content": r.content, "calls": calls,
                                     "tool_call_id": r.tool_call_id, "tool_name": names.get(r.tool_call_id or ""),
                                     "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                                     "cached_tokens": int(meta.get("cached_tokens") or 0),
                                     "answered_by": f"{meta['provider']}:{meta.get('model')}"
                                     if meta.get("provider") else None, "created_at": r.created_at,
                                     "files": _files(meta)})
            turn["prompt_tokens"] += r.prompt_tokens or 0
            turn["completion_tokens"] += r.completion_tokens or 0
            turn["cached_tokens"] += int(meta.get("cached_tokens") or 0)
            turn["cost_usd"] += float(meta.get("cost_usd") or 0.0)
        return {**dict(row._mapping), "turns": turns}

    def users(self, query: str = "", limit: int = PAGE_ROWS) -> list[dict[str, Any]]:
        """Users, newest first, each with ``identities`` (platform, tenant, platform user id,
        display name, linked_at). ``query`` matches a user id prefix, a display name or a platform
        user id (case-insensitive)."""
        statement = select(_users).order_by(_users.c.created_at.desc()).limit(limit)
        query = query.strip()
        if query:
            matching = select(_identities.c.user_id).where(or_(
                _identities.c.display_name.icontains(query, autoescape=True),
                _identities.c.platform_user_id.icontains(query, autoescape=True)))
            statement = statement.where(or_(_users.c.id.startswith(query.lower(), autoescape=True),
                                            _users.c.id.in_(matching)))
        with read_tx(self.engine) as conn:
            users = [dict(r._mapping) for r in conn.execute(statement).all()]
            ids = [u["id"] for u in users]
            identities = conn.execute(select(_identities).where(_identities.c.user_id.in_(ids))
                                      .order_by(_identities.c.id)).all() if ids else []
        by_user: dict[str, list[dict[str, Any]]] = {}
        for identity in identities:
            by_user.setdefault(identity.user_id, []).append(dict(identity._mapping))
        return [{**u, "identities": by_user.get(u["id"], [])} for u in users]

    def pending_approvals(self) -> list[dict[str, Any]]:
        """Approvals waiting for a decision, oldest first."""
        with read_tx(self.engine) as conn:
            rows = conn.execute(select(_approvals).where(_approvals.c.status == "pending")
                                .order_by(_approvals.c.created_at)).all()
        return [dict(r._mapping) for r in rows]


def _pretty(arguments: str) -> str:
    """Tool call arguments (a JSON string) indented for reading; invalid JSON as it came."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(arguments)


def _files(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """A message's file references as the session page lists them: kind, quoted name, type, size,
    why it could not be used, and the sha256 of an image's rendition for its thumbnail."""
    from gateway.media.render import human_size, quoted

    out = []
    for ref in meta.get("attachments", ()) if isinstance(meta.get("attachments"), list) else ():
        if not isinstance(ref, dict):
            continue
        image = ref.get("image")
        image = image if isinstance(image, dict) else {}
        out.append({"kind": ref.get("kind"), "name": quoted(ref.get("name")), "mime_type": ref.get("mime_type"),
                    "size": human_size(int(ref.get("size") or 0)), "note": ref.get("note"),
                    "thumb": image.get("sha256"), "sha256": ref.get("sha256")})
    return out
