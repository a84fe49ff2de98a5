"""The plan's progress message (issue 13): one chat message per turn, edited in place.

When the model calls ``update_plan``, the turn's ``PlanMessage.show`` (on the tool's thread)
sends the plan once as its own message, through the adapter on the main loop, and records that
message's id on an outbox row of its own (``streaming``, key ``<turn>:plan``) before anything else
(the same preview path as streamed replies, ``gateway.delivery.streaming``). Later plans edit it, at most
once per the platform's edit interval, one edit in flight. When the turn finishes, the plan's
last state goes to the outbox with the reply (same transaction) and delivery edits the message
one last time; the reply itself is a message of its own, delivered once. So a turn shows at most
one plan message, however often the plan changes, and the plan never repeats the reply.

Only where replies stream (``agent.streaming`` and an adapter that can ``edit``); elsewhere the
plan is in the transcript and ``/status`` only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import time
from typing import Any

from agent.plan import render_plan
from agent.resume_state import restore_state
from agent.turn_state import PlanSteps, TurnState
from gateway.core.ports import can_edit
from gateway.core.types import ChatAddress, OutboundMessage
from gateway.delivery.streaming import SEND_TIMEOUT_S, StreamHub
from gateway.store.sql import StoredMessage

log = logging.getLogger("gateway.delivery.progress")

PLAN_TOOL = "update_plan"


def plan_key(reply_key: str) -> str:
    """The plan row's idempotency key for a turn whose reply has ``reply_key`` (``...:0``)."""
    return reply_key.rsplit(":", 1)[0] + ":plan"


class PlanMessage:
    """The progress message of one turn. ``show`` runs on tool threads; never raises."""

    def __init__(self, hub: StreamHub, adapter: Any, address: ChatAddress, key: str, reply_to_id: str | None,
                 session: tuple[str, str, int]) -> None:
        self._hub = hub
        self._adapter = adapter
        self._address = address
        self.key = key
        self._reply_to_id = reply_to_id
        self._session = session
        self._interval = hub.intervals.get(address.platform, 1.0)
        self._last_push = 0.0
        self._inflight: concurrent.futures.Future[Any] | None = None
        self.text: str | None = None
        self.message_id: str | None = None
        self.disabled = False
        self.edits = 0

    @classmethod
    def open(cls, hub: StreamHub | None, *, address: ChatAddress, reply_key: str, reply_to_id: str | None,
             session_id: str, session_key: str, generation: int) -> PlanMessage | None:
        """The turn's plan message, or ``None`` where replies do not stream (no edit)."""
        if hub is None or hub.loop is None or address.platform not in hub.platforms:
            return None
        adapter = hub.adapters.get(address.platform)
        if adapter is None or not can_edit(adapter):
            return None
        return cls(hub, adapter, address, plan_key(reply_key), reply_to_id, (session_id, session_key, generation))

    def show(self, steps: PlanSteps) -> None:
        """Shows ``steps``: the first call sends the message, later ones edit it (throttled: a
        skipped edit is caught up by the final one)."""
        self.text = render_plan(steps)
        if self.disabled:
            return
        try:
            if self.message_id is None:
                self._send_first(self.text)
                return
            if self._inflight is not None and not self._inflight.done():
                return
            if time.monotonic() - self._last_push < self._interval:
                return
            self._last_push = time.monotonic()
            self._inflight = self._submit(self._adapter.edit(self._address, self.message_id, self.text))
            self.edits += 1
        except Exception:
            log.exception("plan message for %s failed; the plan stays in the transcript", self.key)
            self.disabled = True

    def _send_first(self, text: str) -> None:
        store, address = self._hub.store, self._address
        if self._hub.chat_waiting(address):
            return  # delivery holds the chat for a retry; try at the next update
        session_id, session_key, generation = self._session
        start = store.start_stream(OutboundMessage(address, "", self.key), session_id, session_key, generation)
        if start is None:
            return  # an earlier reply to this chat is not delivered yet; try at the next update
        if start.preview_id is not None:
            self.message_id = start.preview_id  # a resumed turn keeps editing its message
            return
        if not start.send:
            self.disabled = True  # already final, or a crash left the first send's fate unknown
            return
        row_id = start.row_id
        message = OutboundMessage(address, text, f"{self.key}:first", reply_to_id=self._reply_to_id, format="plain",
                                  editable=True)
        try:
            result = self._submit(self._adapter.send(message)).result(SEND_TIMEOUT_S)
        except Exception:
            self.disabled = True
            raise
        if result.ok and result.platform_message_ids:
            self.message_id = result.platform_message_ids[0]
            store.set_preview(row_id, self.message_id)
            self._last_push = time.monotonic()
        else:
            self.disabled = True
            store.set_preview(row_id, None if not result.platform_message_ids else "?")
            log.info("plan message for %s not sent (%s)", self.key, result.error)

    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        assert self._hub.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._hub.loop)

    def final(self) -> OutboundMessage | None:
        """The plan's last state for the outbox (an edit of the message), or ``None`` when no
        message was shown."""
        if self.message_id is None or self.text is None:
            return None
        return OutboundMessage(self._address, self.text, self.key, format="plain")

    def close(self, timeout: float = SEND_TIMEOUT_S) -> None:
        """Waits for the edit in flight, so the final edit cannot be overtaken by it."""
        if self._inflight is not None:
            try:
                self._inflight.result(timeout)
            except Exception as exc:
                log.debug("last plan edit for %s failed: %s", self.key, exc)


def latest_plan(window: list[StoredMessage]) -> PlanSteps | None:
    """The newest plan of the newest turn in ``window`` (a transcript tail), read from its
    ``update_plan`` calls (a call the tool refused, whose result is an error, does not count);
    ``None`` when that turn made none."""
    last_turn = next((m.turn_id for m in reversed(window) if m.role == "user"), None)
    refused = {m.tool_call_id for m in window if m.role == "tool" and (m.content or "").startswith("Error")}
    for message in reversed(window):
        if message.turn_id != last_turn:
            continue
        for call in reversed(message.tool_calls or []):
            if call.get("function", {}).get("name") != PLAN_TOOL or call.get("id") in refused:
                continue
            try:
                steps = json.loads(call["function"].get("arguments") or "{}").get("steps")
            except (ValueError, AttributeError):
                continue
            if isinstance(steps, list) and all(isinstance(s, dict) for s in steps):
                return [{"step": str(s.get("step", "")), "status": str(s.get("status", "pending"))} for s in steps]
    return None


def resumed_state(window: list[StoredMessage], turn_id: str) -> TurnState:
    """The state a turn continues with: rebuilt from its messages already in ``window`` (a turn
    resumed after a crash keeps its skills, plan and checklist), empty for a new turn."""
    return restore_state([{"role": m.role, "content": m.content, "tool_calls": m.tool_calls,
                           "tool_call_id": m.tool_call_id} for m in window if m.turn_id == turn_id])
