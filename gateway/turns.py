"""A turn: inbound message(s) to the final reply (DESIGN §3.4). Runs on a worker thread.

Load the session (stored system prompt + transcript window), append the user message(s), run the
agent loop (each message written to the transcript as it happens), then finish the turn: the
reply goes to the outbox in the same transaction that marks the inbox row(s) done. A turn
resumed after a crash finds its user message already in the transcript and continues from there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from agent.bridge import AsyncBridge
from agent.budget import Limits, initial_note
from agent.cache import AgentCache, AgentSpec
from agent.context import RunContext
from agent.loop import run_turn
from agent.model import ModelError, Usage
from gateway.commands import command_reply
from gateway.context import render_history, user_meta
from gateway.store.sql import PendingInbound, Store, StoredMessage
from gateway.streaming import StreamHub
from gateway.types import OutboundMessage

log = logging.getLogger("gateway.turns")


class TurnRunner:
    """Runs turns against one store with the agent the cache holds for ``spec``.

    Args:
        agents: the agent cache (model client + mounted tools by signature).
        spec: which agent chat turns use (model, endpoint, key, toolset).
        limits: the run boundaries of each turn's task.
        system_prompt: stored on each new session at creation and reused byte for byte.
        history_window: transcript messages loaded per turn.
        streams: opens a streamed preview for turns on streaming platforms (``None``: no streaming).
    """

    def __init__(self, *, store: Store, agents: AgentCache, spec: AgentSpec, bridge: AsyncBridge | None,
                 limits: Limits, history_window: int, system_prompt: str, streams: StreamHub | None = None) -> None:
        self.store = store
        self.agents = agents
        self.spec = spec
        self.bridge = bridge
        self.limits = limits
        self.history_window = history_window
        self.system_prompt = system_prompt
        self.streams = streams

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

        reply_key = f"{turn_id}:0"

        def finish(status: str, text: str | None, session_id: str | None) -> str:
            replies = [] if text is None else [
                OutboundMessage(message.address, text, idempotency_key=reply_key, reply_to_id=message.reply_to_id)
            ]
            self.store.finish_turn(inbox_ids, status, replies, session_id=session_id, session_key=key,
                                   generation=generation,
                                   merged_status="cancelled" if status == "cancelled" else "merged",
                                   stream_key=reply_key)
            return status

        direct = command_reply(message.command) if len(batch) == 1 else None
        if direct is not None:
            return finish("done", direct, None)

        session_id, system_prompt = self.store.current_session(key, lambda: self.system_prompt)
        window = self.store.load_window(session_id, self.history_window)
        present = {(m.turn_id, m.role) for m in window}
        for pending in batch:
            pending_turn = f"in{pending.inbox_id}"
            if (pending_turn, "user") not in present:
                meta = user_meta(pending.message, time.time(), budget=initial_note(self.limits))
                row_id = self.store.append_message(session_id, pending_turn, "user", pending.message.text,
                                                   meta=meta, platform_message_id=pending.message.message_id)
                window.append(StoredMessage(row_id, pending_turn, "user", pending.message.text, None, None, None, meta))

        def record(msg: dict[str, Any], usage: Usage | None, meta: dict[str, Any] | None) -> None:
            self.store.append_message(
                session_id, turn_id, msg["role"], msg.get("content"),
                tool_calls=msg.get("tool_calls"), tool_call_id=msg.get("tool_call_id"), meta=meta,
                prompt_tokens=usage.prompt_tokens if usage else None,
                completion_tokens=usage.completion_tokens if usage else None,
            )

        def should_stop() -> bool:
            return self.store.lane_generation(key) != generation

        agent = self.agents.get(self.spec)
        stream = None
        if self.streams is not None:
            stream = self.streams.open(address=message.address, idempotency_key=reply_key,
                                       reply_to_id=message.reply_to_id, session_id=session_id, session_key=key,
                                       generation=generation)
        try:
            outcome = run_turn(system_prompt=system_prompt, history=render_history(window), model=agent.model,
                               tools=agent.tools, bridge=self.bridge, limits=self.limits, record=record,
                               should_stop=should_stop, on_text=stream.on_text if stream is not None else None,
                               context=RunContext(session_id=session_id, turn_id=turn_id))
        except ModelError as exc:
            log.warning("turn %s failed: %s", turn_id, exc)
            return finish("failed", f"⚠️ {exc.user_message}", session_id)
        finally:
            if stream is not None:
                stream.close()
        if outcome.stop_reason == "cancelled":
            log.info("turn %s cancelled at a step boundary", turn_id)
            return finish("cancelled", None, session_id)
        if outcome.stop_reason not in ("stop", "length"):
            log.info("turn %s stopped by %s after %d model calls ($%.4f)", turn_id, outcome.stop_reason,
                     outcome.steps, outcome.cost_usd)
        return finish("done", outcome.reply.strip() or "(no answer)", session_id)
