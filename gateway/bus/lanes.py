"""The session bus (DESIGN §3.3): one lane per session key, at most one turn per key at a time.

The main loop only schedules: ``kick(key)`` asks a worker thread to drain that key's pending
inbox rows. The worker first claims the key's lease in the database (so two instances never run
the same session at once), then runs the oldest pending message's turn (or, with the ``merge``
policy, one turn for every message waiting), then the next, and releases the lease when none is
left. A lease keeper renews held leases; a sweeper picks up keys whose rows wait without a live
lease (after a crash, or on another instance's behalf).

Graceful stop (``begin_stop``, then ``wait_idle``): no new lane is drained and no next turn
started; running turns finish their step (``TurnInterrupted`` leaves their rows pending) and
their leases are renewed until ``stop``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any

from sqlalchemy import Connection

from gateway.core.errors import TurnInterrupted
from gateway.core.types import ChatAddress, InboundMessage
from gateway.store.sql import LaneNext, NewSessions, PendingInbound, Prefetch, Store

log = logging.getLogger("gateway.bus.lanes")

_Drained = tuple[ChatAddress | None, bool]
"""What ``SessionBus._drain`` returns: the address of its last turn (its end not yet told to the
main loop) and whether rows were stored meanwhile."""

MERGE_LIMIT = 20
"""Most messages answered together by one merged turn."""
ALBUM_LIMIT = 10
"""Telegram albums (``sendMediaGroup``) hold 2-10 items."""


@dataclasses.dataclass(slots=True, frozen=True)
class Claimed:
    """A free lane claimed in the transaction that stored a row for it (``SessionBus.claim_free_in``):
    its first batch, the lane's generation, what the prefetch read for it (its ``value`` set once
    that transaction committed) and when the claim began (``time.monotonic()`` seconds, taken before
    its statement: the lease runs from about then, whatever the claim waited for)."""

    batch: list[PendingInbound]
    generation: int
    prefetch: Prefetch | None
    at: float


def commands_apart(batch: list[PendingInbound]) -> list[PendingInbound]:
    """The part of a lane's waiting rows one turn answers: a command (``/new``, ``/link CODE``...)
    alone, else the rows before the next command. A command is answered by the gateway only in a
    turn of its own (``TurnRunner``); merged, its arguments would reach the model as a message and
    the command would never run. The rows left out stay pending for the lane's next turns."""
    if batch and batch[0].message.command is not None:
        return batch[:1]
    cut = next((i for i, row in enumerate(batch) if row.message.command is not None), len(batch))
    return batch[:cut]


class SessionBus:
    """Dispatches inbox rows to turns.

    Args:
        run_turn: runs one turn on the calling worker thread: ``(batch, generation, then, ready) ->
            status``; ``then`` (``LaneNext``) is handed to ``Store.finish_turn``, which reads the
            lane's next rows or gives its lease up in the turn's last transaction; ``ready`` is what
            ``prefetch`` read for the batch (``None``: nothing).
        prefetch: reads for a turn made in the transaction that hands the lane its rows
            (``Store.claim_next``, ``claim_free_lane_in``, ``finish_turn``): ``(conn, batch, fresh) -> ready``
            (``Prefetch``; ``fresh``: the lane was created in that transaction).
        busy_policy: ``queue`` (a turn per message, FIFO), ``merge`` (messages waiting when the
            lane frees are answered in one turn) or ``interrupt`` (handled at receive time: a new
            message cancels the running turn; then like ``queue``).
        on_turn_start / on_turn_end: called on the main loop with the chat address (typing).
        on_replies: called on the main loop after each turn (``None``: nothing; the gateway's turn
            runner hands its replies to delivery itself).
        merges: whether the messages waiting in a lane are answered together, asked with the first
            of them (per-chat busy policies; blocking, on the worker thread); ``None``: ``busy_policy``
            decides for every lane.
        album_wait_s: a batch starting with an album item (``media_group_id``) waits until this
            long after that item was sent, then takes every pending item of the album into one
            turn (``media.album_wait_s``; the platform delivers an album as one message per item).
    """

    def __init__(self, *, store: Store, run_turn: Callable[[Sequence[PendingInbound], int, LaneNext, Any], str],
                 workers: Executor, instance_id: str, lease_s: float, sweep_interval_s: float,
                 busy_policy: str, on_turn_start: Callable[[ChatAddress], None],
                 on_turn_end: Callable[[ChatAddress], None], on_replies: Callable[[], None] | None = None,
                 album_wait_s: float = 0.0, merges: Callable[[InboundMessage], bool] | None = None,
                 prefetch: Callable[[Connection, list[PendingInbound], bool | NewSessions], Any] | None = None) -> None:
        self.prefetch = prefetch
        self.album_wait_s = album_wait_s
        self.merges = merges
        self.store = store
        self._run_turn = run_turn
        self._workers = workers
        self.instance_id = instance_id
        self.lease_s = lease_s
        self.sweep_interval_s = sweep_interval_s
        self.batch_size = MERGE_LIMIT if busy_policy == "merge" else 1
        self._on_turn_start = on_turn_start
        self._on_turn_end = on_turn_end
        self._on_replies = on_replies
        self._loop: asyncio.AbstractEventLoop | None = None
        self._active: set[str] = set()  # keys with a drain scheduled or running here (main loop only)
        self._again: set[str] = set()  # keys kicked while active: drain once more
        self._held: set[str] = set()  # keys whose lease this instance holds (worker threads)
        self._held_lock = threading.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = threading.Event()
        self.turns_done = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._tasks = [asyncio.create_task(self._sweep(), name="bus-sweep"),
                       asyncio.create_task(self._keep_leases(), name="bus-leases")]

    def begin_stop(self) -> None:
        """From now on no lane is drained and no next turn starts (the rows stay pending for the
        next start, or for another instance's sweeper); running turns go on (main loop only)."""
        self._stopping.set()
        self._again.clear()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for every drain of this instance to end (after ``begin_stop``);
        returns whether none is left."""
        deadline = time.monotonic() + timeout_s
        while self._active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not self._active

    @property
    def running(self) -> int:
        """Lanes being drained here (a turn running, or waiting for a worker thread)."""
        return len(self._active)

    async def stop(self) -> None:
        """Stops the sweeper and the lease keeper (after ``wait_idle``: leases of turns still
        running then expire after ``lease_s``)."""
        self._stopping.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def _new_prefetch(self) -> Prefetch | None:
        """A ``Prefetch`` of ``prefetch`` for one lane's claim (``None`` without one)."""
        return Prefetch(self.prefetch) if self.prefetch is not None else None

    def claim_free_in(self, conn: Connection, key: str) -> Claimed | None:
        """In the write transaction ``conn`` that stored a row for ``key`` (the admit,
        ``gateway.inbound.receive``; any thread): when no turn holds ``key``'s lane (a new chat's, or
        one whose last turn ended), claims it for this instance and reads its batch and prefetch
        there (``Store.claim_free_lane_in``), so the turn starts without a claim transaction of its
        own. Hand the result to ``kick`` once the transaction committed. ``None``: a lease is held, a
        drain of ``key`` runs or waits here (it takes the row), the bus is stopping, or the database
        cannot do it in one statement (the drain claims the lane the ordinary way)."""
        if self._stopping.is_set() or key in self._active:
            return None
        prefetch = self._new_prefetch()
        at = time.monotonic()  # before the claim: its lease runs from then, however long it waits
        claimed = self.store.claim_free_lane_in(conn, key, self.instance_id, self.lease_s, self.batch_size, prefetch)
        if claimed is None:
            return None
        return Claimed(claimed[0], claimed[1], prefetch, at)

    def claim_free_many_in(self, conn: Connection, keys: Sequence[str]) -> dict[str, Claimed]:
        """``claim_free_in`` for each of ``keys`` (distinct), all in the write transaction ``conn``
        that stored their rows (a batch's admit): on PostgreSQL the new chats' lanes in one
        statement (``Store.claim_free_lanes_in``). Returns the keys claimed, each with its
        ``Claimed`` for ``kick``; a key missing is left to its drain, as ``claim_free_in``'s
        ``None``."""
        if self._stopping.is_set():
            return {}
        free = [key for key in keys if key not in self._active]
        if not free:
            return {}
        at = time.monotonic()  # before the claim: its leases run from then (``claim_free_in``)
        made = self.store.claim_free_lanes_in(
            conn, free, self.instance_id, self.lease_s, self.batch_size,
            self._new_prefetch)
        return {key: Claimed(batch, generation, prefetch, at) for key, (batch, generation, prefetch) in made.items()}

    def kick(self, key: str, claimed: Claimed | None = None) -> None:
        """Ensures ``key`` gets drained (main loop only; cheap, never blocks). A no-op once
        stopping. ``claimed``: the lane was claimed with its first batch when its row was stored
        (``claim_free_in``, committed): the drain runs that batch without claiming (when it starts
        within a third of the lease; later it claims again, in case the lease was lost).

        The drain is handed to a worker from the loop's next iteration, not at once: the caller
        (a webhook's handler) first writes its response. A worker woken at once would wait for the
        interpreter lock the handler still holds and need a second wake (measured: the drain
        started 0.19 ms after the response was written; deferred, the update -> model median is
        0.1-0.5 ms lower)."""
        if self._stopping.is_set():
            if claimed is not None:  # the lease would keep other instances out until it expired
                self._release_soon(key)
            return
        if key in self._active:
            # With ``claimed``, that drain started after the claim (``claim_free_in`` claims no
            # lane with a drain here): it claims the lane again, this instance's, and runs what
            # waits; the claimed batch is left to it.
            self._again.add(key)
            return
        self._active.add(key)
        if self._loop is not None:
            self._loop.call_soon(self._submit, key, claimed)
        else:
            self._submit(key, claimed)

    def _submit(self, key: str, claimed: Claimed | None) -> None:
        """Runs ``_drain(key, claimed)`` on a turn worker; ``_drained`` follows on the loop."""
        try:
            future = self._workers.submit(self._drain, key, claimed)
        except RuntimeError:  # the workers were shut down since the kick: the rows wait for the next start
            self._active.discard(key)
            log.debug("lane %s: not drained, the workers are shut down", key)
            return
        future.add_done_callback(lambda f, k=key: self._call_main(self._drained, k, f))  # type: ignore[misc]

    def _drained(self, key: str, future: Future[_Drained]) -> None:
        """On the main loop once ``_drain(key)`` ended: its last turn's end (typing stops; one hop
        for both), and ``key`` drained again when rows were stored meanwhile."""
        self._active.discard(key)
        if future.cancelled():
            return
        if future.exception() is not None:
            log.error("lane %s failed; the sweeper will retry it", key, exc_info=future.exception())
            return
        ended, waiting = future.result()
        if ended is not None:
            self._turn_ended(ended)
        if waiting or key in self._again:
            self._again.discard(key)
            self.kick(key)

    @property
    def idle(self) -> bool:
        return not self._active

    # -- worker thread -----------------------------------------------------------------------
    def _release_soon(self, key: str) -> None:
        """Gives up the lease of a lane claimed for a drain that will not run (main loop)."""
        try:
            self._workers.submit(self.store.release_lane, key, self.instance_id)
        except RuntimeError:  # the workers are shut down: the next start releases this instance's leases
            log.debug("lane %s: lease left to expire", key)

    def _drain(self, key: str, claimed: Claimed | None = None) -> _Drained:
        """Runs ``key``'s waiting turns under its lease (worker thread). Returns the address of the
        last turn, whose end the main loop is told of with the drain's own end (``_drained``: one
        hop instead of two), and whether rows were stored meanwhile (drain again). ``claimed``:
        see ``kick``."""
        if self._stopping.is_set():
            if claimed is not None:
                self.store.release_lane(key, self.instance_id)
            return None, False  # queued behind busy workers when the stop began: rows wait for the next start
        if claimed is not None and time.monotonic() - claimed.at < self.lease_s / 3:
            batch, generation, first = claimed.batch, claimed.generation, claimed.prefetch
            if first is not None:
                first.commit()  # its transaction committed before the claim reached ``kick``
        else:
            first = self._new_prefetch()
            again = self.store.claim_next(key, self.instance_id, self.lease_s, self.batch_size, first)
            if again is None:
                return None, False  # another instance runs this session (it drains what waits), or nothing waits
            batch, generation = again
        ready = first.value if first is not None else None
        with self._held_lock:
            self._held.add(key)
        released = waiting = False
        ended: ChatAddress | None = None
        try:
            while batch:
                batch = self._with_album(key, self._merged(key, batch))
                address = batch[-1].message.address
                if ended is not None:
                    self._call_main(self._turn_ended, ended)
                ended = None
                self._call_main(self._on_turn_start, address)
                # The next rows, or the lease given up when none wait, are read in the turn's last
                # transaction (``then``). A message stored between that read and the release would
                # wait for the sweeper: the release looks once more, and we drain again if so.
                then = LaneNext(key, self.instance_id, self.batch_size,
                                self._new_prefetch())
                try:
                    self._run_turn(batch, generation, then, ready)
                except BaseException:
                    self._call_main(self._turn_ended, address)
                    raise
                ended = address
                self.turns_done += 1
                if then.released:
                    released, waiting = True, then.waiting
                    break
                if self._stopping.is_set():
                    break  # the next rows wait for the next start (the lease is given up below)
                if then.done:
                    batch, generation = then.batch, then.generation
                    ready = then.prefetch.value if then.prefetch is not None else None
                else:  # the turn ended without finishing its rows' lane step (no ``finish_turn``)
                    batch, generation, waiting = self.store.next_or_release(key, self.instance_id, self.batch_size)
                    ready = None
            else:
                released = True
        except TurnInterrupted:
            log.info("lane %s: turn interrupted by the stop; it resumes at the next start", key)
        finally:
            with self._held_lock:
                self._held.discard(key)
            if not released:  # stopping, or a turn or the store raised: give the lease up for the retry
                waiting = self.store.release_lane(key, self.instance_id)
        return ended, waiting

    def _turn_ended(self, address: ChatAddress) -> None:
        """On the main loop after a turn: ``on_turn_end`` (typing stops), then ``on_replies`` (one
        hop from the worker for both)."""
        self._on_turn_end(address)
        if self._on_replies is not None:
            self._on_replies()

    def _merged(self, key: str, batch: list[PendingInbound]) -> list[PendingInbound]:
        """``batch`` as the chat's busy policy wants it (``merges``, asked once per turn): its first
        row alone when the chat does not merge, every waiting row (up to ``MERGE_LIMIT``) when it
        does, but never a command with other rows (``commands_apart``)."""
        if self.merges is None:
            return commands_apart(batch)
        merges = self.merges(batch[0].message)
        if not merges:
            return batch[:1]
        if len(batch) >= MERGE_LIMIT or self.batch_size == MERGE_LIMIT:
            return commands_apart(batch)  # read as a merge already
        rows = self.store.pending_batch(key, MERGE_LIMIT)
        return commands_apart(rows if rows and rows[0].inbox_id == batch[0].inbox_id else batch)

    def _with_album(self, key: str, batch: list[PendingInbound]) -> list[PendingInbound]:
        """``batch``, or, when it starts with an album item, every pending item of that album (after
        waiting ``album_wait_s`` from the item's send time for the rest to arrive)."""
        group = batch[0].message.media_group_id
        if not group or self.album_wait_s <= 0:
            return batch
        # + 1 s: platforms date messages in whole seconds (Telegram ``date``).
        wait = batch[0].message.received_at + 1.0 + self.album_wait_s - time.time()
        if wait > 0:
            self._stopping.wait(min(wait, self.album_wait_s + 1.0))
        rows = self.store.pending_batch(key, ALBUM_LIMIT + len(batch))
        album = list(itertools.takewhile(lambda p: p.message.media_group_id == group, rows))
        return album if album and album[0].inbox_id == batch[0].inbox_id else batch

    def _call_main(self, fn: Callable[..., None], *args: object) -> None:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: a turn the stop timeout cut finished after the exit began
            log.debug("main loop closed; %s not called", getattr(fn, "__name__", fn))

    # -- background --------------------------------------------------------------------------
    async def _sweep(self) -> None:
        while True:
            try:
                keys = await asyncio.to_thread(self.store.keys_waiting, time.time())
                for key in keys:
                    self.kick(key)
            except Exception:
                log.exception("sweep failed")
            await asyncio.sleep(self.sweep_interval_s)

    async def _keep_leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            with self._held_lock:
                keys = list(self._held)
            if keys:
                try:
                    await asyncio.to_thread(self.store.renew_lanes, keys, self.instance_id, self.lease_s)
                except Exception:
                    log.exception("lease renewal failed")
