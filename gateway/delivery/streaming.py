"""Streamed replies (DESIGN §3.5): one preview message, edited while the model writes.

A turn's worker thread feeds ``TurnStream.on_text`` with the step's text so far. Once the model
has been writing for ``first_after_s`` (short replies are never previewed), the preview is sent
once through the adapter on the main loop (``run_coroutine_threadsafe``), and its platform id is
recorded on the turn's outbox row (status ``streaming``, created then) before anything else
happens. Later text edits that message, at most once per the platform's interval, one edit in
flight, unchanged text skipped. These preview edits are best effort and never retried.

The preview's row is taken and its id recorded by the main loop too, in one coroutine with the
send, through group commits: in a burst of streamed replies those writes go together in a few
transactions instead of two on each worker thread, which queued on SQLite's single writer.

The final reply is not sent by the stream: the turn finishes into the outbox as usual, the row
gets the final text (claimed, or ``pending``), and delivery edits the preview into part 1 (later
parts are new messages). So the whole reply is delivered once, by the outbox, exactly-once rules and
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
from gateway.core.types import ChatAddress, DeliveryResult, OutboundMessage
from gateway.store.group_commit import GroupCommit
from gateway.store.outbox import StreamRequest, StreamStart
from gateway.store.sql import Store

log = logging.getLogger("gateway.delivery.streaming")

PREVIEW_MAX_CHARS = 3500
"""A preview is one platform message (Telegram 4096 UTF-16 units, Slack ~4000 characters)."""
PREVIEW_SUFFIX = " …"
SEND_TIMEOUT_S = 15.0


def asked_to_wait(future: concurrent.futures.Future[Any]) -> float:
    """Seconds the platform asked to wait after the edit ``future`` ran (a refused edit's
    ``retry_after``: Telegram's 429 ``parameters.retry_after``, Slack's ``Retry-After``, Feishu's
    ``x-ogw-ratelimit-reset``); 0 when it succeeded, failed otherwise or raised."""
    if future.cancelled() or future.exception() is not None:
        return 0.0
    result = future.result()
    if isinstance(result, DeliveryResult) and not result.ok and result.retry_after:
        return result.retry_after
    return 0.0


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
        submit_db: queues a blocking call for the DB pool (``Offload.submit``): the preview's
            row and id are written by the main loop, group-committed (``write_now``: on the loop
            itself when that never waits).
    """

    def __init__(self, *, store: Store, adapters: Mapping[str, Adapter], platforms: set[str],
                 first_after_s: float, intervals: Mapping[str, float],
                 chat_waiting: Callable[[ChatAddress], bool],
                 submit_db: Callable[..., asyncio.Future[Any]],
                 write_now: Callable[..., tuple[bool, Any]] | None = None) -> None:
        self.store = store
        self.adapters = adapters
        self.platforms = platforms
        self.first_after_s = first_after_s
        self.intervals = intervals
        self.chat_waiting = chat_waiting
        self.loop: asyncio.AbstractEventLoop | None = None
        # one preview's row or id at a time, or those asked for meanwhile together (a burst)
        self._starts: GroupCommit[StreamRequest, StreamStart | None] = GroupCommit(
            store.start_stream_request, store.start_streams, submit_db=submit_db, now=write_now)
        self._previews: GroupCommit[tuple[int, str | None], bool] = GroupCommit(
            store.set_preview_of, store.set_previews, submit_db=submit_db, now=write_now)

    async def first_preview(self, request: StreamRequest, adapter: Adapter,
                            message: OutboundMessage) -> tuple[StreamStart | None, DeliveryResult | None]:
        """Main loop: takes the reply's row (``Store.start_stream``), sends ``message`` when it may
        be sent, and records the preview's id (``Store.set_preview``: the id, ``"?"`` when its fate
        is unknown, ``None`` when it certainly failed). Returns what ``start_stream`` found and the
        send's result (``None`` when nothing was sent). Raises what the send raises (the row keeps
        ``"?"``: unknown whether it arrived) and the store's errors."""
        start = await self._starts.write(request)
        if start is None or not start.send:
            return start, None
        result = await adapter.send(message)
        if result.ok and result.platform_message_ids:
            await self._previews.write((start.row_id, result.platform_message_ids[0]))
        else:
            await self._previews.write((start.row_id, None if not result.platform_message_ids else "?"))
        return start, result

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
        self._held_until = 0.0  # monotonic: no edit before (the platform's retry_after)
        self.preview_id: str | None = None
        self.disabled = False
        self.edits = 0

    @property
    def row_taken(self) -> bool:
        """Whether a preview was tried, so the reply's outbox row may exist (``Store.start_stream``
        takes it before the preview is sent)."""
        return self._last_try > 0.0

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
            if now - self._last_push < self._interval or now < self._held_until or \
                    (self._inflight is not None and not self._inflight.done()):
                return  # (most deltas: checked before the preview's text is made)
            shown = preview_text(text)
            if shown == self._shown:
                return
            self._last_push, self._shown = now, shown
            self._inflight = self._submit(self._adapter.edit(self._address, self.preview_id, shown))
            self._inflight.add_done_callback(self._edited)
            self.edits += 1
        except Exception:
            log.exception("streaming preview for %s failed; the reply will be sent whole", self._key)
            self.disabled = True

    def _edited(self, future: concurrent.futures.Future[Any]) -> None:
        """An edit refused with a wait (a rate limit): no edit until it has passed, since each edit
        meanwhile is refused too and flood control lengthens the wait."""
        wait = asked_to_wait(future)
        if wait:
            self._held_until = time.monotonic() + wait

    def _send_preview(self, text: str) -> None:
        """Takes the reply's row, sends the preview and records its id, all on the main loop
        (``StreamHub.first_preview``), waiting at most ``SEND_TIMEOUT_S``."""
        hub, address = self._hub, self._address
        if hub.chat_waiting(address):
            return  # delivery holds the chat for a retry
        request = StreamRequest(OutboundMessage(address, "", self._key, reply_to_id=self._reply_to_id),
                                *self._session)
        message = OutboundMessage(address, preview_text(text), f"{self._key}:preview",
                                  reply_to_id=self._reply_to_id, format="plain", editable=True)
        try:
            start, result = self._submit(hub.first_preview(request, self._adapter, message)).result(SEND_TIMEOUT_S)
        except Exception:
            self.disabled = True  # unknown whether it arrived: the row keeps "?" (the final is sent whole)
            raise
        if start is None:
            return  # an earlier reply to this chat is not delivered yet: a preview would overtake it
        if start.preview_id is not None:
            self.preview_id = start.preview_id  # a resumed turn keeps editing its preview
            return
        if result is None:
            self.disabled = True  # already final, or a crash left the preview's fate unknown
            return
        if result.ok and result.platform_message_ids:  # (its id is recorded on the row already)
            self.preview_id = result.platform_message_ids[0]
            self._last_push, self._shown = time.monotonic(), message.text
        else:
            self.disabled = True
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
