"""Receiver leases: one poller per bot across instances (Telegram long polling).

An adapter with a ``receiver_lease`` name receives only while this instance holds that lease in
the ``lanes`` table; the other instances stand by and take over when it expires (a crash) or is
released (a stop). A restarted instance with the same id takes its own lease over at once
(``gateway.ops.instance``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.core.ports import Adapter
from gateway.store.sql import Store

log = logging.getLogger("gateway")


async def hold_receiver(adapter: Adapter, *, store: Store, instance_id: str, lease_s: float,
                        run_db: Callable[..., Awaitable[Any]]) -> None:
    """Runs until cancelled: claims or renews ``adapter.receiver_lease`` every ``lease_s / 3``
    seconds, starts receiving when it is held and stops when it is lost. On cancellation the
    adapter stops receiving and the lease is released. A database error keeps the current state
    until the next try."""
    name = adapter.receiver_lease
    assert name is not None
    receiving = False
    try:
        while True:
            try:
                if receiving:
                    held = name in await run_db(store.renew_lanes, [name], instance_id, lease_s)
                else:
                    held = await run_db(store.claim_lane, name, instance_id, lease_s)
            except Exception:
                log.exception("receiver lease %s: database error", name)
                held = receiving
            if held and not receiving:
                log.info("receiving on %s (lease %s held)", adapter.platform, name)
                await adapter.start_receiving()
                receiving = True
            elif not held and receiving:
                log.warning("lost receiver lease %s; standing by", name)
                await adapter.stop_receiving()
                receiving = False
            await asyncio.sleep(lease_s / 3)
    finally:
        if receiving:
            await adapter.stop_receiving()
            await run_db(store.release_lane, name, instance_id)
