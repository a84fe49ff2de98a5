"""Delivery marks: what a delivery writes on an outbox row around each platform call.

A mark is ``(outbox id, owner, the columns it sets)``; ``Store.settle`` writes one (only while
``owner`` still holds the row's claim: a stale sender is fenced off), ``Store.settle_many`` several
in one transaction (the delivery's ``GroupCommit``). The builders take the time when they are
called, so a mark queued behind others carries the moment it was made.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

Mark = tuple[int, str, dict[str, Any]]
"""One outbox row's delivery mark: ``(outbox id, owner, the columns it sets)``, written only while
``owner`` holds the row's claim (``Store.settle``)."""


def sending_mark(outbox_id: int, owner: str, platform_message_ids: Sequence[str], claim_s: float) -> Mark:
    """``Store.mark_sending``'s mark: *sending*, the parts delivered before, the claim extended by
    ``claim_s`` seconds from now."""
    return outbox_id, owner, {"status": "sending", "platform_message_ids": list(platform_message_ids),
                              "claim_until": time.time() + claim_s}


def progress_mark(outbox_id: int, owner: str, platform_message_ids: Sequence[str], claim_s: float) -> Mark:
    """``Store.mark_progress``'s mark: still *claimed*, the parts delivered so far, the claim extended."""
    return outbox_id, owner, {"status": "claimed", "platform_message_ids": list(platform_message_ids),
                              "claim_until": time.time() + claim_s}


def sent_mark(outbox_id: int, owner: str, platform_message_ids: Sequence[str], status: str = "sent",
              note: str | None = None) -> Mark:
    """``Store.mark_sent``'s mark: ``status`` (*sent*, or *unconfirmed*), the platform's ids, now."""
    return outbox_id, owner, {"status": status, "platform_message_ids": list(platform_message_ids),
                              "sent_at": time.time(), "error": note}


def retry_mark(outbox_id: int, owner: str, next_attempt_at: float, error: str, sent_ids: Sequence[str]) -> Mark:
    """``Store.mark_retry``'s mark: *pending* again from ``next_attempt_at`` (epoch seconds), unclaimed."""
    return outbox_id, owner, {"status": "pending", "next_attempt_at": next_attempt_at, "error": error,
                              "claimed_by": None, "platform_message_ids": list(sent_ids)}


def failed_mark(outbox_id: int, owner: str, error: str, sent_ids: Sequence[str]) -> Mark:
    """``Store.mark_failed``'s mark: *failed* with ``error``."""
    return outbox_id, owner, {"status": "failed", "error": error, "platform_message_ids": list(sent_ids)}
