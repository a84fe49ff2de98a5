"""``PoolGuard``: finds database connections held across a model or tool call, for tests.

The rule it checks: a connection checked out of the engine's pool before a thread started a model
call (``agent.model.OpenAIChatModel.complete``) or a step's tool calls (``agent.execute.run_calls``
as the agent loop calls it) is not still checked out by that thread while the call is in flight.
A turn that keeps a session, connection or transaction open while the model streams pins one of
the pool's few connections for seconds; with a pool of 5 and 200 turns in flight the others queue
for it, or time out. Short transactions made *during* a call (a streamed preview recorded, a
tool's own read) are not this fault and are not reported.

How: SQLAlchemy's pool events ``checkout``/``checkin`` record which thread holds which connection
and when (a sequence number); the two call sites are wrapped (the real functions still run) to
record when each thread entered its outermost call. Everything is updated under one lock, so
``check()`` sees one consistent state. Call ``check()`` while a call is surely in flight: from the
fake OpenAI's ``on_request`` hook (the requesting turn is then blocked in its model call) or from
the handler of a server a tool fetches from.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, event

import agent.loop
from agent.model import OpenAIChatModel


class PoolGuard:
    """Watches ``engine``'s pool and the model and tool call sites (build it before turns start;
    ``close()`` undoes everything).

    Attributes:
        checks: how many times ``check()`` ran.
        waiting_seen: threads found inside a model or tool call, summed over the checks (checks
            that saw none prove nothing: tests assert this is positive).
        violations: one line per connection held across a call (thread name, which call).
    """

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.engine = engine
        self.checks = 0
        self.waiting_seen = 0
        self.violations: list[str] = []
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._held: dict[int, tuple[int, int]] = {}  # id(connection record) -> (thread ident, checked out at)
        self._calls: dict[int, tuple[str, int]] = {}  # thread ident -> (outermost call, entered at)
        event.listen(engine, "checkout", self._checkout)
        event.listen(engine, "checkin", self._checkin)
        monkeypatch.setattr(OpenAIChatModel, "complete", self._watched("model call", OpenAIChatModel.complete))
        monkeypatch.setattr(agent.loop, "run_calls", self._watched("tool call", agent.loop.run_calls))

    def close(self) -> None:
        """Stops watching the pool (``monkeypatch`` restores the call sites at the test's end)."""
        event.remove(self.engine, "checkout", self._checkout)
        event.remove(self.engine, "checkin", self._checkin)

    def _watched(self, what: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            ident = threading.get_ident()
            with self._lock:
                outer = ident not in self._calls
                if outer:
                    self._calls[ident] = (what, next(self._seq))
            try:
                return fn(*args, **kwargs)
            finally:
                if outer:
                    with self._lock:
                        self._calls.pop(ident, None)

        return call

    def _checkout(self, _dbapi: Any, record: Any, _proxy: Any) -> None:
        with self._lock:
            self._held[id(record)] = (threading.get_ident(), next(self._seq))

    def _checkin(self, _dbapi: Any, record: Any) -> None:
        with self._lock:
            self._held.pop(id(record), None)

    def held_by(self, thread_ident: int) -> int:
        """Connections ``thread_ident`` has checked out now."""
        with self._lock:
            return sum(1 for ident, _ in self._held.values() if ident == thread_ident)

    def assert_clean(self) -> None:
        """``check()`` now and fail (``AssertionError``) on any connection held across a call."""
        found = self.check()
        assert not found, "; ".join(found)

    def check(self) -> list[str]:
        """Records (and returns) the connections held right now across a call in flight; counts
        the threads in a call in ``waiting_seen``."""
        names = {t.ident: t.name for t in threading.enumerate()}
        with self._lock:
            found = []
            for ident, since in self._held.values():
                call = self._calls.get(ident)
                if call is not None and since < call[1]:
                    found.append(f"thread {names.get(ident, ident)} holds a connection across a {call[0]}")
            self.checks += 1
            self.waiting_seen += len(self._calls)
            self.violations.extend(found)
        return found
