"""``UploadQuota``: how much one browser may upload to the web chat per hour.

The web chat hands every visitor an identity (a signed cookie), so without a bound anyone who can
open the page could fill the blob store; files never sent are deleted later
(``media.unreferenced_hours``), and this keeps what one browser stores meanwhile small. Counted in
this process's memory (a sliding hour per browser): with several instances each counts its own.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 3600.0
MAX_TRACKED = 10_000
"""Browsers tracked before those with nothing in the last hour are forgotten."""


class UploadQuota:
    """At most ``files`` uploads and ``size`` bytes per browser in any hour.

    Args:
        files: uploads per browser per hour (``web.uploads_per_hour``), at least 1.
        size: bytes per browser per hour (``web.upload_mb_per_hour`` in bytes), at least 1.
        clock: monotonic seconds (tests pass their own).

    Raises:
        ValueError: ``files`` or ``size`` below 1.
    """

    def __init__(self, files: int, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        if files < 1 or size < 1:
            raise ValueError("an upload quota needs at least one file and one byte an hour")
        self.files = files
        self.size = size
        self._clock = clock
        self._seen: dict[str, deque[tuple[float, int]]] = {}

    def _recent(self, user_id: str, now: float) -> deque[tuple[float, int]]:
        uploads = self._seen.get(user_id)
        if uploads is None:
            if len(self._seen) >= MAX_TRACKED:
                self._forget_idle(now)
            uploads = self._seen[user_id] = deque()
        while uploads and uploads[0][0] <= now - WINDOW_S:
            uploads.popleft()
        return uploads

    def _forget_idle(self, now: float) -> None:
        for user_id in [u for u, q in self._seen.items() if not q or q[-1][0] <= now - WINDOW_S]:
            del self._seen[user_id]

    def wait_s(self, user_id: str, size: int) -> float | None:
        """``None`` when ``user_id`` may upload ``size`` more bytes now; otherwise the seconds until
        enough of their last hour's uploads have aged out."""
        now = self._clock()
        uploads = self._recent(user_id, now)
        used = sum(n for _, n in uploads)
        if len(uploads) < self.files and used + size <= self.size:
            return None
        # the oldest uploads free their share first: wait until enough of them are an hour old
        files_over, bytes_over = len(uploads) + 1 - self.files, used + size - self.size
        for at, n in uploads:
            files_over, bytes_over = files_over - 1, bytes_over - n
            if files_over <= 0 and bytes_over <= 0:
                return max(0.0, at + WINDOW_S - now)
        return WINDOW_S  # larger than a whole hour's quota: refused until the hour is empty

    def add(self, user_id: str, size: int) -> None:
        """Counts an upload of ``size`` bytes by ``user_id`` now."""
        now = self._clock()
        self._recent(user_id, now).append((now, size))
