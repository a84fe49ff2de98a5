"""A failed delivery's error is stored redacted: it goes on to ``outbox.error``, a report run's
error, the owner's failure notice and the admin pages, none of which is a log the log filter
cleans. An adapter's error text can carry a secret (aiohttp's proxy errors name the proxy URL with
its password; found by a review)."""

from __future__ import annotations

import asyncio

from agent.redact import Redactor
from gateway.core.types import ChatAddress, DeliveryResult, InboundMessage, OutboundMessage, Sender
from gateway.delivery.outbox import Delivery
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import Store

LEAKY = ("network: aiohttp.ClientHttpProxyError: 503, message='Service Unavailable', "
         "url='http://proxyuser:proxypass@10.0.0.5:3128' while sending with configured-secret-value")


async def test_an_adapters_error_is_stored_without_the_secrets_it_carried(tmp_path):
    engine = create_db_engine(f"sqlite:///{tmp_path / 'd.db'}")
    upgrade(engine)
    store = Store(engine)
    address = ChatAddress("telegram", "1", "9201")
    store.insert_inbound(InboundMessage(address, "9201:1", "dm", Sender("9201"), "hi"), "k")
    [pending] = store.next_pending("k")
    store.finish_turn([pending.inbox_id], "done", [OutboundMessage(address, "the report", "in1:0")], session_key="k")

    class Refused:
        platform = "telegram"
        idempotent_send = False

        async def send(self, message, on_part=None, before_part=None):
            return DeliveryResult(False, error=LEAKY)  # not retryable: failed at once

    async def on_thread(fn, *args):
        return await asyncio.to_thread(fn, *args)

    delivery = Delivery(store=store, adapters={"telegram": Refused()}, instance_id="me", run_db=on_thread,
                        redact=Redactor(["configured-secret-value"]))
    await delivery.start()
    try:
        delivery.send_claimed(store.claim_outbox("me", 10, 30))
        for _ in range(200):
            if store.outbox_rows()[0]["status"] == "failed":
                break
            await asyncio.sleep(0.02)
    finally:
        await delivery.stop(1)
    [row] = store.outbox_rows()
    assert row["status"] == "failed"
    assert "503" in row["error"] and "proxypass" not in row["error"] and "configured-secret-value" not in row["error"]
    engine.dispose()
