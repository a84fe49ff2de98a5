"""Session reset policies: an idle timeout and/or a daily hour in a configured zone."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from gateway.core.i18n import _


@dataclass(frozen=True)
class ResetPolicy:
    """When a conversation is considered over and the next message starts a fresh one.

    Attributes:
        idle_s: seconds without use after which the session resets (``None``: never).
        daily_hour: hour of day (0-23, in ``zone``) after which the previous day's session resets.
        zone: IANA time zone name of ``daily_hour``.
    """

    idle_s: float | None = None
    daily_hour: int | None = None
    zone: str = "UTC"

    def expired(self, last_used_at: float | None, now: float | None = None) -> bool:
        """Whether a session last used at ``last_used_at`` (epoch s) must reset now."""
        if last_used_at is None:
            return False
        now = time.time() if now is None else now
        if self.idle_s is not None and now - last_used_at >= self.idle_s:
            return True
        if self.daily_hour is not None:
            tz = ZoneInfo(self.zone)
            local_now = datetime.fromtimestamp(now, tz)
            boundary = local_now.replace(hour=self.daily_hour, minute=0, second=0, microsecond=0)
            if boundary > local_now:
                boundary -= timedelta(days=1)
            return last_used_at < boundary.timestamp()
        return False

    def describe(self) -> str:
        """Why a session was reset, in the current locale."""
        if self.daily_hour is not None:
            return _("Conversations reset daily at {hour:02d}:00 {zone}", hour=self.daily_hour, zone=self.zone)
        assert self.idle_s is not None
        return _("The last conversation was idle for over {hours:g} h", hours=self.idle_s / 3600)
