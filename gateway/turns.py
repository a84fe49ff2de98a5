"""A turn: inbound message(s) to the final reply (DESIGN §3.4). Runs on a worker thread.

Load the session (stored system prompt + transcript window), append the user message(s), run the
agent loop (each message written to the transcript as it happens), then finish the turn: the
reply goes to the outbox in the same transaction that marks the inbox row(s) done. A turn
resumed after a crash finds its user message already in the transcript and continues from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

from agent.bridge import AsyncBridge
from agent.loop import Limits, run_turn
from agent.model import ChatModel, ModelError, Usage
from agent.tools import ToolRegistry
from gateway.commands import command_reply
from gateway.context import render_history, user_meta
from gateway.store.sql import PendingInbound, Store, StoredMessage
from gateway.types import InboundMessage, OutboundMessage

log = logging.getLogger("gateway.turns")

CURRENT_MESSAGE: ContextVar[InboundMessage | None] = ContextVar("current_message", default=None)
"""The message a turn answers, set while the agent loop runs on the worker thread: tools that act
for the user (``schedule_report``) read who asks and from which chat here, so ``agent/`` stays
free of gateway types."""

CommandHandler = Callable[[InboundMessage], "str | None"]
"""Answers a gateway command without the model (``None``: not one of its commands)."""


class TurnRunner:
    """Runs turns against one store, model and tool registry.

    Args:
        system_prompt: stored on each new session at creation and reused byte for byte.
        history_window: transcript messages loaded per turn.
        commands: answers stateful gateway commands (``/schedule``, ``/jobs``...) in the lane,
            after the static ones (``/help``) and before the model.
    """

    def __init__(self, *, store: Store, model: ChatModel, tools: ToolRegistry, bridge: AsyncBridge | None,
                 limits: Limits, history_window: int, system_prompt: str,
                 commands: CommandHandler | None = None) -> None:
        self.commands = commands
        self.store = store
        self.model = model
        self.tools = tools
        self.bridge = bridge
        self.limits = limits
        self.history_window = history_window
        self.system_prompt = system_prompt

    def run(self, batch: Sequence[PendingInbound], generation: int) -> str:
        """Runs one turn answering ``batch`` (one message, or several merged) to completion and
        returns its outcome (``done``, ``failed``, ``cancelled``).

        ``generation`` is the lane generation the turn started under: once the lane's generation
        moves on (``/stop``, an interrupting message) the turn stops at its next step and sends
        nothing. Raises only on database faults; the inbox rows then stay pending and are retried.
        """
        last = batch[-1]
        message = last.message
        key = last.session_key
        turn_id = f"in{last.inbox_id}"
        inbox_ids = [p.inbox_id for p in batch]

        def finish(status: str, text: str | None, session_id: str | None) -> str:
            replies = [] if text is None else [
                OutboundMessage(message.address, text, idempotency_key=f"{turn_id}:0", reply_to_id=message.reply_to_id)
            ]
            self.store.finish_turn(inbox_ids, status, replies, session_id=session_id, session_key=key,
                                   generation=generation,
                                   merged_status="cancelled" if status == "cancelled" else "merged")
            return status

        direct = None
        if len(batch) == 1 and message.command is not None:
            direct = command_reply(message.command)
            if direct is None and self.commands is not None:
                direct = self.commands(message)
        if direct is not None:
            return finish("done", direct, None)

        session_id, system_prompt = self.store.current_session(key, lambda: self.system_prompt)
        window = self.store.load_window(session_id, self.history_window)
        present = {(m.turn_id, m.role) for m in window}
        for pending in batch:
            pending_turn = f"in{pending.inbox_id}"
            if (pending_turn, "user") not in present:
                meta = user_meta(pending.message, time.time())
                row_id = self.store.append_message(session_id, pending_turn, "user", pending.message.text,
                                                   meta=meta, platform_message_id=pending.message.message_id)
                window.append(StoredMessage(row_id, pending_turn, "user", pending.message.text, None, None, None, meta))

        def record(msg: dict[str, Any], usage: Usage | None) -> None:
            self.store.append_message(
                session_id, turn_id, msg["role"], msg.get("content"),
                tool_calls=msg.get("tool_calls"), tool_call_id=msg.get("tool_call_id"),
                prompt_tokens=usage.prompt_tokens if usage else None,
                completion_tokens=usage.completion_tokens if usage else None,
            )

        def should_stop() -> bool:
            return self.store.lane_generation(key) != generation

        token = CURRENT_MESSAGE.set(message)
        try:
            outcome = run_turn(system_prompt=system_prompt, history=render_history(window), model=self.model,
                               tools=self.tools, bridge=self.bridge, limits=self.limits, record=record,
                               should_stop=should_stop)
        except ModelError as exc:
            log.warning("turn %s failed: %s", turn_id, exc)
            return finish("failed", f"⚠️ {exc.user_message}", session_id)
        finally:
            CURRENT_MESSAGE.reset(token)
        if outcome.stop_reason == "cancelled":
            log.info("turn %s cancelled at a step boundary", turn_id)
            return finish("cancelled", None, session_id)
        text = outcome.reply.strip() or "(no answer)"
        if outcome.stop_reason == "iteration_budget":
            self.store.append_message(session_id, turn_id, "assistant", text, meta={"stop_reason": outcome.stop_reason})
        return finish("done", text, session_id)
