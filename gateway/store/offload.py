"""``Offload``: the small thread pool the main loop hands its blocking store calls to (the DB pool).

``loop.run_in_executor`` on a ``ThreadPoolExecutor`` costs about 150 µs of CPU per call on this
kind of machine before the call itself runs (a ``concurrent.futures.Future`` with its ``Condition``,
an asyncio future chained to it, the executor's locks and semaphore, two thread wake-ups); the
main loop makes three such calls per turn (the inbox write, and a reply's ``mark_sending`` and
``mark_sent``). ``Offload`` hands each call over with one queue put and hands the result back with
one ``call_soon_threadsafe``: about half of that.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Item = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class Offload:
    """``threads`` worker threads (named ``<name>_0``..., started with the first call) running
    blocking calls for an event loop.

    ``await offload.run(fn, *args)`` runs ``fn(*args)`` on a worker and returns its result or raises
    its exception (as ``loop.run_in_executor``). A caller cancelled while ``fn`` runs gets
    ``CancelledError`` at once; ``fn`` still runs to its end (a thread cannot be interrupted), its
    result dropped. ``shutdown`` lets queued calls run, then ends the threads."""

    def __init__(self, threads: int, name: str) -> None:
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(threads)]
        self._closed = False
        self._started = False
        self._start_lock = threading.Lock()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs ``fn(*args)`` on a worker thread. Raises ``RuntimeError`` after ``shutdown``."""
        return await self.submit(fn, *args)

    def submit(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queues ``fn(*args)`` for a worker thread (from the running loop); the future gets its
        result or exception. Cancelling the future before a worker took the call skips it; once
        started, it runs to its end. Raises ``RuntimeError`` after ``shutdown``."""
        if self._closed:
            raise RuntimeError("the DB pool is shut down")
        if not self._started:
            self._start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((loop, future, fn, args))
        return future

    def shutdown(self, wait: bool = True) -> None:
        """No new calls; the queued ones still run. With ``wait``, returns once the threads ended."""
        with self._start_lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if not started:
            return
        for _ in self._threads:
            self._queue.put(None)
        if wait:
            for thread in self._threads:
                thread.join()

    def _start(self) -> None:
        with self._start_lock:  # threads start with the first call (a gateway built and never run has none)
            if self._started or self._closed:
                return
            for thread in self._threads:
                thread.start()
            self._started = True

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, future, fn, args = item
            del item
            if future.cancelled():  # its caller gave up before it started
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as run_in_executor does
                _hand_back(loop, _fail, future, exc)
            else:
                _hand_back(loop, _succeed, future, result)
            del future, fn, args


def _hand_back(loop: asyncio.AbstractEventLoop, how: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(how, *args)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
