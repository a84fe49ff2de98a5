"""``LoginLimiter``: slows down admin password guessing.

Counts failed logins in a sliding window: at most ``per_client`` failures per client address and
``overall`` failures from all addresses together per ``window_s`` (defaults: 5 per address, 100
overall, per 5 minutes, the "limit failed attempts" control of the OWASP Authentication Cheat
Sheet). Past either limit, login answers 429 with ``Retry-After`` until the oldest failure leaves
the window, even for the right password. Past the overall limit, an address that has not failed
itself still gets one of ``fresh`` tries per window shared by all such addresses (20): many
addresses guessing cannot lock the admin out at once, and cannot guess much more either (one
guess per fresh address, at most ``fresh`` a window). A correct login clears its address's failures.
Held in this process: each instance counts on its own (N instances allow N times the figures).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 300.0
PER_CLIENT = 5
OVERALL = 100
FRESH = 20


class LoginLimiter:
    """Failed admin logins per client address and overall.

    Args:
        window_s: the sliding window (seconds).
        per_client: failures one address may have in the window.
        overall: failures all addresses together may have in the window.
        clock: seconds (``time.monotonic`` by default).
        fresh: tries past the overall limit from addresses without failures, per window.
    """

    def __init__(self, window_s: float = WINDOW_S, per_client: int = PER_CLIENT, overall: int = OVERALL,
                 clock: Callable[[], float] = time.monotonic, fresh: int = FRESH) -> None:
        self.window_s = window_s
        self.fresh = fresh
        self._fresh: deque[float] = deque()  # tries let through past the overall cap
        self.per_client = per_client
        self.overall = overall
        self._clock = clock
        self._by_client: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()

    def _trim(self, failures: deque[float], now: float) -> None:
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()

    def retry_after(self, client: str) -> int | None:
        """Seconds until ``client`` may try again (whole seconds, at least 1), or ``None`` when it
        may try now."""
        now = self._clock()
        self._trim(self._all, now)
        waits = []
        failures = self._by_client.get(client)
        if failures is not None:
            self._trim(failures, now)
            if not failures:
                del self._by_client[client]
            elif len(failures) >= self.per_client:
                waits.append(failures[-self.per_client] + self.window_s - now)
        if len(self._all) >= self.overall:
            self._trim(self._fresh, now)
            if failures or len(self._fresh) >= self.fresh:
                waits.append((self._all[-self.overall] if failures else self._fresh[0]) + self.window_s - now)
            else:  # an address that has not guessed wrong: one of the window's few tries past the cap
                self._fresh.append(now)
        return max(1, math.ceil(max(waits))) if waits else None

    def failed(self, client: str) -> int:
        """Records a failed login from ``client``; returns its failures in the window."""
        now = self._clock()
        failures = self._by_client.setdefault(client, deque())
        failures.append(now)
        self._all.append(now)
        return len(failures)

    def succeeded(self, client: str) -> None:
        """Forgets ``client``'s failures (a correct login)."""
        self._by_client.pop(client, None)
