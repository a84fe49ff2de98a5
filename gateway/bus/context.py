"""The context window: a projection of the transcript into model-facing messages (DESIGN §5).

Rendering is deterministic, so the same transcript always yields the same bytes (prompt cache):
per-message facts (when a user wrote, who wrote in a group) come from the row's ``meta`` and go
into that user message, never into the system prompt. Internal fields are stripped.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from agent.sequence import INTERRUPTED, repair
from gateway.core.types import InboundMessage
from gateway.store.sql import StoredMessage

__all__ = ["INTERRUPTED", "render_history", "render_user", "user_meta"]


def user_meta(message: InboundMessage, now: float, budget: str | None = None) -> dict[str, Any]:
    """Facts about a user message stored with it and rendered into its text (``budget``: the
    task's starting budget line, so the model knows it without touching the system prompt)."""
    meta: dict[str, Any] = {"time": now}
    if budget:
        meta["budget"] = budget
    if message.chat_type != "dm":
        meta["from"] = message.sender.display_name or message.sender.username or message.sender.user_id
    if message.attachments:
        meta["attachments"] = [
            {"kind": a.kind, "name": a.name, "mime_type": a.mime_type, "size": a.size} for a in message.attachments
        ]
    return meta


def render_user(content: str | None, meta: dict[str, Any] | None) -> str:
    """``[2026-11-30 09:00 UTC, from Bob]`` header line, attachment notes, then the text."""
    meta = meta or {}
    header = []
    if "time" in meta:
        header.append(datetime.fromtimestamp(meta["time"], UTC).strftime("%Y-%m-%d %H:%M UTC"))
    if meta.get("from"):
        header.append(f"from {meta['from']}")
    lines = [f"[{', '.join(header)}]"] if header else []
    if meta.get("budget"):
        lines.append(f"[{meta['budget']}]")
    for attachment in meta.get("attachments", ()):
        described = ", ".join(f"{k}={v}" for k, v in attachment.items() if v is not None and k != "kind")
        lines.append(f"[attached {attachment['kind']}{': ' + described if described else ''}]")
    if meta.get("memory"):
        lines.append(meta["memory"])  # the turn's long-term memory block (gateway.memory), stored with it
    if content:
        lines.append(content)
    return "\n".join(lines)


def render_history(window: list[StoredMessage]) -> list[dict[str, Any]]:
    """Model-facing messages for a transcript window, oldest first.

    The window starts at a user message (a cut never separates tool calls from their results),
    and the sequence is repaired by ``agent.sequence.repair``: orphan tool results are dropped and
    a tool call left unanswered by an interrupted older turn gets an explicit "interrupted" result,
    so it is always valid for the API. Tool calls of the newest assistant message are left for the
    loop to answer (resume after a crash). Internal fields (ids, meta, token counts) are not sent.
    """
    start = next((i for i, m in enumerate(window) if m.role == "user"), len(window))
    out: list[dict[str, Any]] = []
    for row in window[start:]:
        if row.role == "tool":
            out.append({"role": "tool", "tool_call_id": row.tool_call_id, "content": row.content or ""})
        elif row.role == "user":
            out.append({"role": "user", "content": render_user(row.content, row.meta)})
        elif row.role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": row.content}
            if row.tool_calls:
                message["tool_calls"] = row.tool_calls
            out.append(message)
    return repair(out, keep_trailing_calls=True)
