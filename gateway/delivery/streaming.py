"""Streamed replies (DESIGN §3.5): one preview message, edited while the model writes.

A turn's worker thread feeds ``TurnStream.on_text`` with the step's text so far. Once the model
has been writing for ``first_after_s`` (short replies are never previewed), the preview is sent
once through the adapter on the main loop (``run_coroutine_threadsafe``), and its platform id is
recorded on the turn's outbox row (status ``streaming``, created then) before anything else
happens. Later text edits that message, at most once per the platform's interval, one edit in
flight, unchanged text skipped. These preview edits are best effort and never retried.

The final reply is not sent by the stream: the turn finishes into the outbox as usual, the row
turns ``pending`` with the final text, and delivery edits the preview into part 1 (later parts
are new messages). So the whole reply is delivered once, by the outbox, exactly-once rules and
all. A preview is sent only while no other reply to the chat is unsettled (chat order), and only
on platforms whose adapter can ``edit`` and that ``agent.streaming`` lists.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.core.ports import Adapter, can_edit
from gateway.core.types import ChatAddress, OutboundMessage
from gateway.store.sql import Store

log = logging.getLogger("gateway.delivery.streaming")

PREVIEW_MAX_CHARS = 3500
"""A preview is one platform message (Telegram 4096 UTF-16 units, Slack ~4000 characters)."""
PREVIEW_SUFFIX = " …"
SEND_TIMEOUT_S = 15.0


def preview_text(text: str) -> str:
    """What a preview shows for the text so far: its head, marked as still being written."""
    text = text.strip()
    if len(text) > PREVIEW_MAX_CHARS:
        text = text[:PREVIEW_MAX_CHARS]
    return text + PREVIEW_SUFFIX


class StreamHub:
    """Opens a ``TurnStream`` for turns on streaming platforms. ``bind(loop)`` at gateway start.

    Args:
        platforms: platforms where replies stream (``agent.streaming``).
        first_after_s: the model must have been writing this long before a preview is sent.
        intervals: seconds between preview edits per platform (Telegram ~1/s per chat).
        chat_waiting: whether delivery holds the chat for a retry (no preview then).
    """

    def __init__(self, *, store: Store, adapters: Mapping[str, Adapter], platforms: set[str],
                 first_after_s: float, intervals: Mapping[str, float],
                 chat_waiting: Callable[[ChatAddress], bool]) -> None:
        self.store = store
        self.adapters = adapters
        self.platforms = platforms
        self.first_after_s = first_after_s
        self.intervals = intervals
        self.chat_waiting = chat_waiting
        self.loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def open(self, *, address: ChatAddress, idempotency_key: str, reply_to_id: str | None, session_id: str,
             session_key: str, generation: int) -> TurnStream | None:
        """A stream for one turn's reply, or ``None`` when its platform does not stream."""
        adapter = self.adapters.get(address.platform)
        if self.loop is None or adapter is None or address.platform not in self.platforms or not can_edit(adapter):
            return None
        return TurnStream(self, adapter, address, idempotency_key, reply_to_id, session_id, session_key, generation)


class TurnStream:
    """The preview of one turn's reply. ``on_text`` and ``close`` run on the turn's worker thread."""

    def __init__(self, hub: StreamHub, adapter: Any, address: ChatAddress, key: str, reply_to_id: str | None,
                 session_id: str, session_key: str, generation: int) -> None:
        self._hub = hub
        self._adapter = adapter
        self._address = address
        self._key = key
        self._reply_to_id = reply_to_id
        self._session = (session_id, session_key, generation)
        self._interval = hub.intervals.get(address.platform, 1.0)
        self._started: float | None = None
        self._last_try = 0.0
        self._last_push = 0.0
        self._shown = ""
        self._inflight: concurrent.futures.Future[Any] | None = None
        self.preview_id: str | None = None
        self.disabled = False
        self.edits = 0

    def on_text(self, text: str) -> None:
        """The model's text so far (called for each streamed delta); never raises."""
        if self.disabled or not text.strip():
            return
        now = time.monotonic()
        if self._started is None:
            self._started = now
        try:
            if self.preview_id is None:
                if now - self._started >= self._hub.first_after_s and now - self._last_try >= self._interval:
                    self._last_try = now
                    self._send_preview(text)
                return
            if now - self._last_push < self._interval or (self._inflight is not None and not self._inflight.done()):
                return  # (most deltas: checked before the preview's text is made)
            shown = preview_text(text)
            if shown == self._shown:
                return
            self._last_push, self._shown = now, shown
            self._inflight = self._submit(self._adapter.edit(self._address, self.preview_id, shown))
            self.edits += 1
        except Exception:
            log.exception("streaming preview for %s failed; the reply will be sent whole", self._key)
            self.disabled = True

    def _send_preview(self, text: str) -> None:
        store, address = self._hub.store, self._address
        if self._hub.chat_waiting(address):
            return  # delivery holds the chat for a retry
        session_id, session_key, generation = self._session
        start = store.start_stream(OutboundMessage(address, "", self._key, reply_to_id=self._reply_to_id),
                                   session_id, session_key, generation)
        if start is None:
            return  # an earlier reply to this chat is not delivered yet: a preview would overtake it
        if start.preview_id is not None:
            self.preview_id = start.preview_id  # a resumed turn keeps editing its preview
            return
        if not start.send:
            self.disabled = True  # already final, or a crash left the preview's fate unknown
            return
        row_id = start.row_id
        shown = preview_text(text)
        message = OutboundMessage(address, shown, f"{self._key}:preview", reply_to_id=self._reply_to_id,
                                  format="plain", editable=True)
        try:
            result = self._submit(self._adapter.send(message)).result(SEND_TIMEOUT_S)
        except Exception:
            self.disabled = True  # unknown whether it arrived: leave "?" (the final is then sent whole)
            raise
        if result.ok and result.platform_message_ids:
            self.preview_id = result.platform_message_ids[0]
            store.set_preview(row_id, self.preview_id)
            self._last_push, self._shown = time.monotonic(), shown
        else:
            self.disabled = True
            store.set_preview(row_id, None if not result.platform_message_ids else "?")
            log.info("preview for %s not sent (%s); the reply will be sent whole", self._key, result.error)

    def _submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        assert self._hub.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._hub.loop)

    def close(self, timeout: float = SEND_TIMEOUT_S) -> None:
        """Waits for the edit in flight, so the final delivery (an edit too) cannot be overtaken."""
        if self._inflight is not None:
            try:
                self._inflight.result(timeout)
            except Exception as exc:
                log.debug("last preview edit for %s failed: %s", self._key, exc)
