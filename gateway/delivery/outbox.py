"""Delivery (DESIGN §3.5): sends outbox rows through the adapters, retrying with backoff.

The one owner of delivery retries. Rows of one chat go out strictly in order (the store hands
out at most the oldest unsettled row per chat), different chats in parallel. A platform's
retry-after is honoured, and no other call goes to a chat while its reply waits to be retried.

A turn's reply usually arrives already claimed (``Store.finish_turn``'s ``claim``) and is sent at
once (``send_claimed``); every other row waits for a pass (``wake``, or the poll).

Exactly once: a row is claimed (``claimed``), and each part is marked ``sending`` right before
its API call and recorded right after. A streamed reply's row carries its preview's id
(``OutboundMessage.edit_id``): part 1 is delivered as an edit of the preview, never as a new
message. A row found ``sending`` after its owner died may or may not
have reached the platform: unless the platform dedupes by our key, that part is never sent again
and the row ends ``unconfirmed`` (logged), the only case where we cannot know.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from gateway.core.ports import Adapter
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.telemetry import span as traced
from gateway.store.group_commit import GroupCommit, submit_via
from gateway.store.marks import Mark, failed_mark, progress_mark, retry_mark, sending_mark, sent_mark
from gateway.store.outbox import OutboxItem
from gateway.store.sql import Store

log = logging.getLogger("gateway.delivery.outbox")


class ClaimLost(Exception):
    """Our claim on an outbox row expired and another instance took it: stop sending its parts."""


UNCONFIRMED = "?"
"""Stands in the row's platform message ids for a part that may or may not have arrived."""


class Delivery:
    """The delivery loop. ``wake()`` after queuing replies; it also polls for due retries.

    ``run_db`` runs a blocking store call off the loop (``submit_db``: queues one, returning its
    future; default: a task running ``run_db``); ``write_now`` (``Gateway.write_now``; default none)
    runs a row's delivery mark (``gateway.store.marks``: one short write transaction) on the loop
    when that never waits, else the DB pool does; marks made while one is written are written
    together (``GroupCommit``), each send resuming once its own mark is committed."""

    def __init__(self, *, store: Store, adapters: Mapping[str, Adapter], instance_id: str,
                 run_db: Callable[..., Any], max_attempts: int = 8, backoff_base_s: float = 1.0,
                 backoff_max_s: float = 300.0, claim_s: float = 30.0, poll_s: float = 2.0,
                 metrics: GatewayMetrics | None = None,
                 write_now: Callable[..., tuple[bool, Any]] | None = None,
                 submit_db: Callable[..., asyncio.Future[Any]] | None = None,
                 redact: Callable[[str], str] = lambda text: text) -> None:
        self.store = store
        self.redact = redact
        """Applied to an adapter's error before it is stored (``outbox.error``, then a report run's
        error, its failure notice and the admin pages): no secret an exception's text carried."""
        self.metrics = metrics or GatewayMetrics()
        self.adapters = adapters
        self.instance_id = instance_id
        self._run_db = run_db
        # a row's marks: one short write each, on the loop when that never waits; marks made while
        # one is written go together in one transaction (a burst's replies)
        submit = submit_db or submit_via(run_db)
        self._marks: GroupCommit[Mark, bool] = GroupCommit(store.settle, store.settle_many, submit_db=submit,
                                                           now=write_now)
        self.max_attempts = max_attempts
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.claim_s = claim_s
        self.poll_s = poll_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._waiting: dict[tuple[str, str, str], float] = {}  # chat -> retry time (this instance)
        self._closing = False
        self._passes = 0  # passes finished
        self._in_pass = False
        self._last_pass_empty = False  # the last finished pass ended on a claim that found nothing due
        self._pass_done = asyncio.Event()
        self._direct: set[asyncio.Task[None]] = set()  # sends of rows claimed when queued (send_claimed)
        self._wakes = 0
        self.sent = 0

    def wake(self) -> None:
        self._wakes += 1
        self._wake.set()

    def send_claimed(self, items: list[OutboxItem]) -> None:
        """Sends rows this instance claimed when they were queued (``Store.finish_turn``'s ``claim``:
        a turn's reply, sent without waiting for a ``claim_due`` pass). Main loop only. While
        stopping, nothing new is sent: the graceful stop frees this instance's claims
        (``InstanceStore.release``), so the next start, or another instance, sends them."""
        if self._task is None or self._closing:
            return
        for item in items:
            task = asyncio.create_task(self._send_direct(item), name=f"deliver-{item.id}")
            self._direct.add(task)
            task.add_done_callback(self._direct.discard)

    async def _send_direct(self, item: OutboxItem) -> None:
        wakes = self._wakes
        try:
            await self._send(item)
        except Exception:
            log.exception("delivery of outbox row %s failed; it is claimed again when its claim expires", item.id)
        if self._wakes != wakes:
            # Rows queued meanwhile may have waited behind this one (chat order): look again.
            self.wake()

    def chat_waiting(self, platform: str, tenant: str, chat_id: str) -> bool:
        """Whether a reply to this chat waits for a retry (rate limit): no other call may go to
        the chat meanwhile, typing indicators included."""
        until = self._waiting.get((platform, tenant, chat_id))
        return until is not None and until > time.time()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="delivery")
        self.wake()

    async def drain(self, timeout_s: float) -> bool:
        """Delivers what is due now, and the retries this instance scheduled within ``timeout_s``
        (a graceful stop: replies of the turns that just finished). Returns ``True`` once a pass
        started after this call found nothing due and no such retry is left; ``False`` at the
        timeout (what is left stays in the outbox for the next start or another instance), and
        ``True`` at once when delivery is not running."""
        if self._task is None:
            return True
        loop = asyncio.get_running_loop()
        deadline, wall_deadline = loop.time() + timeout_s, time.time() + timeout_s
        # A pass running now may have claimed before the last replies were queued: count from the next.
        want = self._passes + (2 if self._in_pass else 1)
        self.wake()
        while True:
            now = time.time()  # a retry already due was claimed by that pass, here or elsewhere
            if self._direct:  # replies sent as they were queued: they finish first
                done, _ = await asyncio.wait(set(self._direct), timeout=max(0.0, deadline - loop.time()))
                if not done and loop.time() >= deadline:
                    return False
                continue
            if self._passes >= want and self._last_pass_empty and \
                    not any(now < until <= wall_deadline for until in self._waiting.values()):
                return True
            if self._passes >= want and not self._last_pass_empty:
                self.wake()  # that pass sent rows: look again for the rows behind them
            remaining = deadline - loop.time()
            if remaining <= 0 or self._task is None:
                return False
            self._pass_done.clear()
            try:
                await asyncio.wait_for(self._pass_done.wait(), remaining)
            except TimeoutError:
                return False

    async def stop(self, grace_s: float = 5.0) -> None:
        """Claims nothing more and lets the sends in flight finish (at most ``grace_s``; a send
        cut then is found ``sending`` at the next start and recorded ``unconfirmed``)."""
        if self._task is None:
            return
        self._closing = True
        self.wake()
        tasks = [self._task, *self._direct]
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.gather(*tasks, return_exceptions=True)), grace_s)
        except TimeoutError:
            log.warning("delivery: sends still in flight after %.0f s; stopping them", grace_s)
        except Exception:
            pass  # the task's own failure was logged by it
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    async def _run(self) -> None:
        while not self._closing:
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except TimeoutError:
                pass
            self._wake.clear()
            self._in_pass, empty = True, False
            try:
                while not self._closing:
                    claimed = await self._run_db(self.store.claim_due, self.instance_id, 100, self.claim_s)
                    if not claimed.items:
                        empty = True
                        break
                    await asyncio.gather(*(self._send(item) for item in claimed.items))
                    if not claimed.more:
                        break  # nothing waits behind these: no empty claim (a write) after each pass
            except Exception:
                log.exception("delivery pass failed")
                await asyncio.sleep(1.0)
            self._passes += 1
            self._in_pass, self._last_pass_empty = False, empty
            self._pass_done.set()

    async def _send(self, item: OutboxItem) -> None:
        platform = item.message.address.platform
        attributes = {"gateway.platform": platform, "gateway.outbox.id": item.id, "gateway.delivery.attempt":
                      item.attempts, "gateway.idempotency_key": item.message.idempotency_key}
        with traced(f"deliver {platform}", attributes=attributes):
            await self._send_item(item)

    async def _send_item(self, item: OutboxItem) -> None:
        adapter = self.adapters.get(item.message.address.platform)
        if adapter is None:
            await self._marks.write(failed_mark(item.id, self.instance_id, "no adapter for platform", item.sent_ids))
            return
        message, prior, note = item.message, list(item.sent_ids), None
        edit_in_flight = message.edit_id is not None and message.resume_from == 0
        if item.unconfirmed and not getattr(adapter, "idempotent_send", False) and not edit_in_flight:
            # The previous owner died during part `resume_from`'s API call: it may have arrived.
            # Never send it twice: skip it and record that it is unconfirmed. (Part 1 of a streamed
            # reply is an edit of its preview: repeating an edit shows nothing twice, so it is redone.)
            message = dataclasses.replace(message, resume_from=message.resume_from + 1)
            prior.append(UNCONFIRMED)
            note = f"part {message.resume_from} unconfirmed after a crash; not resent"
            log.warning("delivery %s: %s", message.idempotency_key, note)

        async def before_part(index: int) -> None:
            if not await self._marks.write(sending_mark(item.id, self.instance_id, prior, self.claim_s)):
                raise ClaimLost(f"outbox row {item.id} was reclaimed by another instance")

        async def on_part(platform_id: str) -> None:
            prior.append(platform_id)
            if not message.attachments:
                # Text parts follow each other at once: the id is written by the next part's
                # ``mark_sending`` or by ``mark_sent`` (a crash in between leaves this delivered part
                # "unconfirmed": skipped by the retry, never sent twice).
                return
            # A file's upload comes before its part is visible, and may take long: what was
            # delivered is recorded now, so a crash during the upload redoes only the file.
            if not await self._marks.write(progress_mark(item.id, self.instance_id, prior, self.claim_s)):
                raise ClaimLost(f"outbox row {item.id} was reclaimed by another instance")

        try:
            result = await adapter.send(message, on_part, before_part)
        except ClaimLost as exc:
            log.warning("delivery %s stopped: %s", message.idempotency_key, exc)
            return
        except Exception as exc:
            log.exception("adapter %s raised on send", adapter.platform)
            ok, retryable, retry_after = False, True, None
            ids: tuple[str, ...] = ()
            error: str | None = type(exc).__name__
        else:
            ok, ids = result.ok, result.platform_message_ids
            retryable, retry_after, error = result.retryable, result.retry_after, result.error
            error = self.redact(error) if error else error
        chat = (message.address.platform, message.address.tenant, message.address.chat_id)
        self._waiting.pop(chat, None)
        sent_ids = list(prior)
        sent_ids += [i for i in ids if i not in sent_ids]
        if ok:
            status = "unconfirmed" if UNCONFIRMED in sent_ids else "sent"
            await self._marks.write(sent_mark(item.id, self.instance_id, sent_ids, status, note))
            self.sent += 1
            self.metrics.delivery_sends.labels(adapter.platform).inc()
        elif retryable and item.attempts < self.max_attempts:
            backoff = min(self.backoff_max_s, self.backoff_base_s * 2 ** (item.attempts - 1))
            delay = retry_after if retry_after is not None else backoff * (0.5 + random.random())
            log.warning("delivery %s failed (%s); attempt %d, retry in %.1f s", message.idempotency_key, error,
                        item.attempts, delay)
            self._waiting[chat] = time.time() + delay
            self.metrics.delivery_retries.labels(adapter.platform).inc()
            await self._marks.write(retry_mark(item.id, self.instance_id, time.time() + delay, error or "", sent_ids))
            asyncio.get_running_loop().call_later(delay, self.wake)
        else:
            log.error("delivery %s failed permanently: %s", message.idempotency_key, error)
            self.metrics.delivery_failures.labels(adapter.platform).inc()
            await self._marks.write(failed_mark(item.id, self.instance_id, error or "failed", sent_ids))
