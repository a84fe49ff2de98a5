"""The DB pool the main loop hands blocking store calls to (``gateway.store.offload.Offload``)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gateway.store.offload import Offload


async def test_a_call_runs_off_the_loop_and_its_result_or_error_comes_back():
    pool = Offload(2, "dbtest")
    try:
        loop_thread = threading.current_thread()
        ran_on = await pool.run(threading.current_thread)
        assert ran_on is not loop_thread and ran_on.name.startswith("dbtest_")
        assert await pool.run(lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(KeyError, match="gone"):
            await pool.run({}.__getitem__, "gone")
    finally:
        pool.shutdown()


async def test_calls_run_side_by_side_up_to_the_thread_count():
    pool = Offload(3, "dbtest")
    barrier = threading.Barrier(3, timeout=5)
    try:  # three calls that each wait for the other two: they only finish if they run at once
        assert sorted(await asyncio.gather(*(pool.run(barrier.wait) for _ in range(3)))) == [0, 1, 2]
    finally:
        pool.shutdown()


async def test_a_cancelled_caller_does_not_wait_and_the_pool_goes_on():
    pool = Offload(1, "dbtest")
    release = threading.Event()
    try:
        slow = asyncio.ensure_future(pool.run(release.wait, 5))
        queued = asyncio.ensure_future(pool.run(time.time))  # behind the slow one
        await asyncio.sleep(0.05)
        slow.cancel()
        queued.cancel()  # cancelled before it started: never run
        with pytest.raises(asyncio.CancelledError):
            await slow
        release.set()
        assert await asyncio.wait_for(pool.run(lambda: "next"), 5) == "next"
    finally:
        pool.shutdown()


async def test_a_submitted_call_runs_to_its_end_whoever_waits_for_it():
    pool = Offload(1, "dbtest")
    release, ran = threading.Event(), []
    try:
        future = pool.submit(lambda: (release.wait(5), ran.append("done"))[1])
        skipped = pool.submit(ran.append, "never")  # queued behind it
        waiter = asyncio.ensure_future(asyncio.shield(future))
        await asyncio.sleep(0.05)
        waiter.cancel()  # its caller gave up: the call goes on, and its future still ends
        skipped.cancel()  # cancelled before a worker took it: skipped
        release.set()
        await asyncio.wait_for(future, 5)
        await pool.run(lambda: None)
        assert ran == ["done"] and not future.cancelled()
    finally:
        pool.shutdown()


async def test_shutdown_runs_what_was_queued_and_refuses_new_calls():
    pool = Offload(1, "dbtest")
    done: list[int] = []
    first = asyncio.ensure_future(pool.run(lambda: (time.sleep(0.05), done.append(1))))
    second = asyncio.ensure_future(pool.run(done.append, 2))
    await asyncio.sleep(0.01)
    await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)
    await asyncio.gather(first, second)
    assert done == [1, 2]
    with pytest.raises(RuntimeError, match="shut down"):
        await pool.run(time.time)


def test_a_pool_never_used_starts_no_thread():
    before = threading.active_count()
    pool = Offload(4, "dbtest")
    assert threading.active_count() == before
    pool.shutdown()
