"""A turn: one inbound message to its final reply (DESIGN §3.4). Runs on a worker thread.

Load the session (stored system prompt + transcript window), append the user message, run the
agent loop (each message written to the transcript as it happens), then finish the turn: the
reply goes to the outbox in the same transaction that marks the inbox row done.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from agent.bridge import AsyncBridge
from agent.loop import Limits, run_turn
from agent.model import ChatModel, ModelError, Usage
from agent.tools import ToolRegistry
from gateway.commands import command_reply
from gateway.context import render_history, user_meta
from gateway.store.sql import PendingInbound, Store, StoredMessage
from gateway.types import OutboundMessage

log = logging.getLogger("gateway.turns")


class TurnRunner:
    """Runs turns against one store, model and tool registry.

    Args:
        build_system_prompt: called once per new session; its result is stored and reused.
        history_window: transcript messages loaded per turn.
    """

    def __init__(self, *, store: Store, model: ChatModel, tools: ToolRegistry, bridge: AsyncBridge | None,
                 limits: Limits, history_window: int, system_prompt: str) -> None:
        self.store = store
        self.model = model
        self.tools = tools
        self.bridge = bridge
        self.limits = limits
        self.history_window = history_window
        self.system_prompt = system_prompt

    def run(self, pending: PendingInbound) -> None:
        """Runs the turn for ``pending`` to completion (reply queued, inbox row finished).

        Raises only on database faults; the inbox row then stays pending and is retried.
        """
        message = pending.message
        turn_id = f"in{pending.inbox_id}"
        quote = message.reply_to_id

        def reply(text: str) -> OutboundMessage:
            return OutboundMessage(message.address, text, idempotency_key=f"{turn_id}:0", reply_to_id=quote)

        direct = command_reply(message.command)
        if direct is not None:
            self.store.finish_turn(pending.inbox_id, "done", [reply(direct)], None)
            return

        session_id, system_prompt = self.store.current_session(pending.session_key, lambda: self.system_prompt)
        window = self.store.load_window(session_id, self.history_window)
        if not any(m.turn_id == turn_id and m.role == "user" for m in window):
            meta = user_meta(message, time.time())
            row_id = self.store.append_message(session_id, turn_id, "user", message.text, meta=meta,
                                               platform_message_id=message.message_id)
            window.append(StoredMessage(row_id, turn_id, "user", message.text, None, None, None, meta))

        def record(msg: dict[str, Any], usage: Usage | None) -> None:
            self.store.append_message(
                session_id, turn_id, msg["role"], msg.get("content"),
                tool_calls=msg.get("tool_calls"), tool_call_id=msg.get("tool_call_id"),
                prompt_tokens=usage.prompt_tokens if usage else None,
                completion_tokens=usage.completion_tokens if usage else None,
            )

        try:
            outcome = run_turn(system_prompt=system_prompt, history=render_history(window), model=self.model,
                               tools=self.tools, bridge=self.bridge, limits=self.limits, record=record)
        except ModelError as exc:
            log.warning("turn %s failed: %s", turn_id, exc)
            self.store.finish_turn(pending.inbox_id, "failed", [reply(f"⚠️ {exc.user_message}")], session_id)
            return
        text = outcome.reply.strip() or "(no answer)"
        if outcome.stop_reason == "iteration_budget":
            self.store.append_message(session_id, turn_id, "assistant", text, meta={"stop_reason": outcome.stop_reason})
        self.store.finish_turn(pending.inbox_id, "done", [reply(text)], session_id)
