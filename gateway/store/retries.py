"""``retry_locked``: a write transaction retried when the database was busy (SQLite's busy timeout
ran out) or PostgreSQL reported a deadlock or a serialization failure."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.exc import OperationalError
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_random_exponential


def is_lock_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the database was busy or locked (worth retrying the transaction)."""
    return isinstance(exc, OperationalError) and any(
        word in str(exc.orig).lower() for word in ("database is locked", "database is busy", "deadlock detected",
                                                    "could not serialize")
    )


_retry_locked = retry(
    retry=retry_if_exception(is_lock_error),
    wait=wait_random_exponential(multiplier=0.01, max=0.5),
    stop=stop_after_attempt(5),  # after the plain first attempt below: 6 in all
    reraise=True,
)

F = TypeVar("F", bound=Callable[..., Any])


def retry_locked(fn: F) -> F:
    """Retries a whole write transaction, with jitter, when SQLite's busy timeout ran out (or
    PostgreSQL reported a deadlock), up to 6 attempts (tenacity); after the last attempt the error
    surfaces — a row is never dropped silently. The first attempt is a plain call: tenacity's
    per-call set-up (a fresh ``Retrying`` and its state) is paid only once a lock error happened."""
    retried = _retry_locked(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except OperationalError as exc:
            if not is_lock_error(exc):
                raise
        time.sleep(random.uniform(0, 0.01))  # tenacity's first wait (wait_random_exponential, multiplier 0.01)
        return retried(*args, **kwargs)

    call.retry = retried.retry  # type: ignore[attr-defined]  # tenacity's interface (statistics, tests)
    return call  # type: ignore[return-value]
