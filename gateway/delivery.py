"""Delivery (DESIGN §3.5): sends outbox rows through the adapters, retrying with backoff.

Sole owner of delivery retries. Rows of one chat go out in order; different chats in parallel.
A platform's retry-after is honoured; parts of a reply already delivered are never resent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from gateway.ports import Adapter
from gateway.store.sql import OutboxItem, Store

log = logging.getLogger("gateway.delivery")

UNCONFIRMED = "?"
"""Stands in the row's platform message ids for a part that may or may not have arrived."""


class Delivery:
    """The delivery loop. ``wake()`` after queuing replies; it also polls for due retries."""

    def __init__(self, *, store: Store, adapters: Mapping[str, Adapter], instance_id: str,
                 run_db: Callable[..., Any], max_attempts: int = 8, backoff_base_s: float = 1.0,
                 backoff_max_s: float = 300.0, claim_s: float = 120.0, poll_s: float = 2.0) -> None:
        self.store = store
        self.adapters = adapters
        self.instance_id = instance_id
        self._run_db = run_db
        self.max_attempts = max_attempts
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.claim_s = claim_s
        self.poll_s = poll_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    def wake(self) -> None:
        self._wake.set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="delivery")
        self.wake()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                while True:
                    items = await self._run_db(self.store.claim_outbox, self.instance_id, 100, self.claim_s)
                    if not items:
                        break
                    by_chat: dict[tuple[str, str, str], list[OutboxItem]] = defaultdict(list)
                    for item in items:
                        a = item.message.address
                        by_chat[(a.platform, a.tenant, a.chat_id)].append(item)
                    await asyncio.gather(*(self._send_in_order(group) for group in by_chat.values()))
            except Exception:
                log.exception("delivery pass failed")
                await asyncio.sleep(1.0)

    async def _send_in_order(self, items: list[OutboxItem]) -> None:
        for index, item in enumerate(items):
            retry_at = await self._send(item)
            if retry_at is not None:
                # Keep chat order: later rows of this chat wait until the earlier one is retried.
                for later in items[index + 1 :]:
                    await self._run_db(self.store.mark_retry, later.id, retry_at + 0.001 * (index + 1),
                                       "waiting for an earlier reply", later.sent_ids)
                return

    async def _send(self, item: OutboxItem) -> float | None:
        """Sends one row; returns ``None`` when it is settled (sent or failed for good), else the
        time of its next attempt."""
        adapter = self.adapters.get(item.message.address.platform)
        if adapter is None:
            await self._run_db(self.store.mark_failed, item.id, "no adapter for platform", item.sent_ids)
            return None
        message, prior, note = item.message, list(item.sent_ids), None
        if item.unconfirmed and not getattr(adapter, "idempotent_send", False):
            # The previous owner died while sending part `resume_from`: it may have arrived.
            # Never send it twice: skip it and record that it is unconfirmed.
            message = dataclasses.replace(message, resume_from=message.resume_from + 1)
            prior.append(UNCONFIRMED)
            note = f"part {message.resume_from} unconfirmed after a crash; not resent"
            log.warning("delivery %s: %s", message.idempotency_key, note)
            await self._run_db(self.store.mark_progress, item.id, prior, self.claim_s)

        async def on_part(platform_id: str) -> None:
            prior.append(platform_id)
            await self._run_db(self.store.mark_progress, item.id, list(prior), self.claim_s)

        try:
            result = await adapter.send(message, on_part)
        except Exception as exc:
            log.exception("adapter %s raised on send", adapter.platform)
            result_ok, ids, retryable, retry_after, error = False, (), True, None, f"{type(exc).__name__}"
        else:
            result_ok, ids, retryable, retry_after, error = (result.ok, result.platform_message_ids, result.retryable,
                                                            result.retry_after, result.error)
        sent_ids = list(prior)
        sent_ids += [i for i in ids if i not in sent_ids]
        if result_ok:
            status = "unconfirmed" if UNCONFIRMED in sent_ids else "sent"
            await self._run_db(self.store.mark_sent, item.id, sent_ids, status, note)
            self.sent += 1
            return None
        if retryable and item.attempts < self.max_attempts:
            delay = retry_after if retry_after is not None else min(
                self.backoff_max_s, self.backoff_base_s * 2 ** (item.attempts - 1)) * (0.5 + random.random())
            log.warning("delivery %s failed (%s); retry %d in %.1f s", item.message.idempotency_key, error,
                        item.attempts, delay)
            retry_at = time.time() + delay
            await self._run_db(self.store.mark_retry, item.id, retry_at, error or "", sent_ids)
            asyncio.get_running_loop().call_later(delay, self.wake)
            return retry_at
        log.error("delivery %s failed permanently: %s", item.message.idempotency_key, error)
        await self._run_db(self.store.mark_failed, item.id, error or "failed", sent_ids)
        return None
