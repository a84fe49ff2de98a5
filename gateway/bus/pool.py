"""The turn workers: an elastic thread pool bounded by turns in flight, not by a small fixed size.

Turns are synchronous (the agent loop blocks on the model) and each runs on its own thread. The
pool starts a thread when work arrives and none is idle, up to ``max_in_flight`` turns running at
once (``agent.max_turns_in_flight``); beyond that, work waits in the pool's queue (their inbox
rows stay *pending*: back-pressure, nothing dropped). ``warm`` threads are kept (started at
once); threads above that end after ``idle_s`` without work.

A turn waiting for a model provider's call slot (``[[llm.providers]] max_concurrency``) is
*parked* (``parked()``): it does not count as in flight, so the pool may start work for other
providers meanwhile and a slow model with a small limit cannot hold every slot. Parked turns are
bounded too: at most ``max_in_flight`` of them (a wait beyond that keeps its place in flight), so
threads never exceed twice ``max_in_flight``.
A parked turn that gets its slot goes on at once (in flight may then briefly exceed the bound by
the number of turns that were parked).

New threads are started by a starter thread of the pool's own, never by the caller of
``submit``: ``threading.Thread.start`` waits until the new thread runs, and with many threads
wanting the interpreter lock that wait took milliseconds, on the event loop (the bus submits
from it) 100 times in a burst of 200 new chats.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any

log = logging.getLogger(__name__)


class _Item:
    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs


class TurnPool(Executor):
    """An ``Executor`` (module doc) usable with ``loop.run_in_executor``.

    Args:
        max_in_flight: most work items running and not parked (≥ 1).
        warm: threads started at once and kept while idle (0 ≤ warm ≤ max_in_flight).
        idle_s: seconds an extra thread waits for work before it ends.
        name: thread name prefix (``turn_0``, ``turn_1``...).
    """

    def __init__(self, max_in_flight: int, *, warm: int = 0, idle_s: float = 60.0, name: str = "turn") -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.max_in_flight = max_in_flight
        self.warm = max(0, min(warm, max_in_flight))
        self.idle_s = idle_s
        self.name = name
        self._cond = threading.Condition()
        self._queue: collections.deque[_Item] = collections.deque()
        self._threads = 0  # alive
        self._idle = 0  # waiting for work
        self._busy = 0  # running an item (parked ones included)
        self._parked = 0
        self._started = 0
        self._shutdown = False
        self._mine = threading.local()
        self._starts: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._starter = threading.Thread(target=self._start_threads, name=f"{name}_starter", daemon=True)
        self._starter.start()
        with self._cond:
            for _ in range(self.warm):
                self._spawn()

    # -- figures -------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Items running and not parked."""
        return self._busy - self._parked

    @property
    def queued(self) -> int:
        """Items waiting for a thread."""
        return len(self._queue)

    @property
    def threads(self) -> int:
        return self._threads

    # -- Executor ------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queues ``fn(*args, **kwargs)``; raises ``RuntimeError`` after ``shutdown``."""
        future: Future[Any] = Future()
        with self._cond:
            if self._shutdown:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._queue.append(_Item(future, fn, args, kwargs))
            self._wake()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new work; queued work still runs unless ``cancel_futures``; ``wait``: until every
        thread has ended."""
        with self._cond:
            self._shutdown = True
            if cancel_futures:
                while self._queue:
                    self._queue.popleft().future.cancel()
            self._cond.notify_all()
        self._starts.put(None)  # after the starts asked for so far
        if wait:
            with self._cond:
                while self._threads:
                    self._cond.wait(0.1)

    @contextlib.contextmanager
    def parked(self) -> Iterator[None]:
        """Marks the calling pool thread as waiting for something that is not the turn's own work
        (a provider's call slot) while inside; a no-op on any other thread."""
        if not getattr(self._mine, "worker", False):
            yield
            return
        with self._cond:
            park = self._parked < self.max_in_flight  # beyond that many parked, a wait holds its place
            if park:
                self._parked += 1
                self._wake()
        try:
            yield
        finally:
            if park:
                with self._cond:
                    self._parked -= 1

    # -- inside --------------------------------------------------------------------------------
    def _wake(self) -> None:
        """Gets a thread for the queue's head when one may run (caller holds the lock)."""
        if not self._queue or self.in_flight >= self.max_in_flight:
            return
        if self._idle > len(self._queue) - 1:
            self._cond.notify()
        elif self._threads - self._parked < self.max_in_flight:
            self._spawn()  # threads not parked (idle or in flight) never exceed the bound

    def _spawn(self) -> None:
        """Asks the starter thread for one more worker (caller holds the lock); the worker counts
        as alive and idle from now, so ``_wake`` does not ask twice for the same item."""
        self._starts.put(f"{self.name}_{self._started}")
        self._started += 1
        self._threads += 1
        self._idle += 1  # until it takes an item

    def _start_threads(self) -> None:
        """The starter thread: starts the workers ``_spawn`` asked for, in order, until ``None``."""
        while (name := self._starts.get()) is not None:
            try:
                threading.Thread(target=self._work, name=name, daemon=True).start()
            except RuntimeError:  # the system refused a thread ("can't start new thread")
                log.exception("could not start turn worker %s; queued work waits for a running one", name)
                with self._cond:
                    self._threads -= 1
                    self._idle -= 1
                    self._cond.notify_all()

    def _work(self) -> None:
        self._mine.worker = True
        cond = self._cond
        item: _Item | None = None
        with cond:
            try:
                while True:
                    if self._queue and self.in_flight < self.max_in_flight:
                        item = self._queue.popleft()
                        self._idle -= 1
                        self._busy += 1
                        if self._queue:
                            self._wake()
                        cond.release()
                        try:
                            self._run(item)
                        finally:
                            item = None
                            cond.acquire()
                            self._busy -= 1
                            self._idle += 1
                        self._wake()
                        continue
                    if self._shutdown and not self._queue:
                        return
                    if not cond.wait(self.idle_s) and self._threads > self.warm and not self._queue:
                        return
            finally:
                self._idle -= 1
                self._threads -= 1
                cond.notify_all()

    @staticmethod
    def _run(item: _Item) -> None:
        if not item.future.set_running_or_notify_cancel():
            return
        try:
            result = item.fn(*item.args, **item.kwargs)
        except BaseException as exc:
            item.future.set_exception(exc)
        else:
            item.future.set_result(result)
