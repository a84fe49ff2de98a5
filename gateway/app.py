"""``Gateway``: builds the stores, agent, bus and delivery around a set of adapters; start/stop.

Threads (DESIGN §2): the main asyncio loop (HTTP server, adapters, bus scheduling, delivery),
a worker pool for turns, a small pool for the main loop's database calls, and the AsyncBridge.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from agent.bridge import AsyncBridge
from agent.loop import Limits
from agent.model import ChatModel, OpenAIChatModel
from agent.tools import ToolRegistry
from agent.web import WebFetcher
from gateway.bus import SessionBus
from gateway.commands import CONTROL_COMMANDS, control_reply
from gateway.config import GatewayConfig
from gateway.delivery import Delivery
from gateway.http import build_app
from gateway.job_commands import JobCommands
from gateway.job_tool import schedule_report_tool
from gateway.jobs import JobPlanner
from gateway.ports import Adapter
from gateway.push_run import PushRunner
from gateway.pushes import PushService
from gateway.sessions import session_key_for
from gateway.store.db import create_db_engine, upgrade
from gateway.store.jobs import JobStore
from gateway.store.sql import Store
from gateway.turns import TurnRunner
from gateway.types import ChatAddress, InboundMessage, OutboundMessage

log = logging.getLogger("gateway")
T = TypeVar("T")

TYPING_INTERVAL_S = 4.0  # Telegram shows "typing" for ≤ 5 s (Bot API: sendChatAction)


class Gateway:
    """The host process.

    Args:
        config: the loaded configuration.
        adapters: the platform adapters to run (built by ``gateway.wiring``).
        model: overrides the OpenAI-compatible model client (tests may pass another ``ChatModel``).
        serve_http: start the aiohttp server (``gateway chat`` does not need it).
    """

    def __init__(self, config: GatewayConfig, adapters: Sequence[Adapter], *, model: ChatModel | None = None,
                 serve_http: bool = True) -> None:
        self.config = config
        self.instance_id = config.instance_id or f"{socket.gethostname()}:{os.getpid()}"
        self.adapters = {adapter.platform: adapter for adapter in adapters}
        self.serve_http = serve_http
        self.engine = create_db_engine(config.database.url, config.database.pool_size)
        self.store = Store(self.engine)
        self.jobs = JobStore(self.engine)
        self.bridge = AsyncBridge()
        self.tools = ToolRegistry()
        push_tools = ToolRegistry()  # a push's "default" toolset: the chat tools minus chat-only ones
        web_fetch = WebFetcher(self.bridge, allow_private=config.tools.web_fetch_allow_private,
                               max_bytes=config.tools.web_fetch_max_bytes).tool()
        self.tools.add(web_fetch)
        push_tools.add(web_fetch)
        toolsets = {"default": push_tools, "none": ToolRegistry()}
        self.planner = JobPlanner(self.jobs, platforms=self.adapters, operators=config.scheduler.operators,
                                  toolsets=toolsets)
        self.model = model or OpenAIChatModel(
            base_url=config.llm.base_url, api_key=config.secret(config.llm.api_key_env) or "missing-api-key",
            model=config.llm.model, timeout_s=config.llm.timeout_s, max_retries=config.llm.max_retries,
            temperature=config.llm.temperature,
        )
        self.runner = TurnRunner(
            store=self.store, model=self.model, tools=self.tools, bridge=self.bridge,
            limits=Limits(iteration_budget=config.agent.iteration_budget, tool_timeout_s=config.agent.tool_timeout_s,
                          tool_result_max_chars=config.agent.tool_result_max_chars),
            history_window=config.agent.history_window, system_prompt=config.agent.system_prompt,
        )
        self._workers = ThreadPoolExecutor(config.agent.worker_threads, thread_name_prefix="turn")
        self._db_pool = ThreadPoolExecutor(4, thread_name_prefix="db")
        self.delivery = Delivery(
            store=self.store, adapters=self.adapters, instance_id=self.instance_id, run_db=self.run_db,
            max_attempts=config.delivery.max_attempts, backoff_base_s=config.delivery.backoff_base_s,
            backoff_max_s=config.delivery.backoff_max_s, claim_s=config.delivery.claim_s,
        )
        self.pushes: PushService | None = None
        if config.scheduler.enabled:
            sc = config.scheduler
            self.pushes = PushService(
                jobs=self.jobs, runner=PushRunner(turns=self.runner, jobs=self.jobs, toolsets=toolsets),
                run_db=self.run_db, workers=self._workers, instance_id=self.instance_id, on_queued=self.delivery.wake,
                misfire_grace_s=sc.misfire_grace_s, claim_timeout_s=sc.claim_timeout_s,
                reload_interval_s=sc.reload_interval_s,
            )
            self.tools.add(schedule_report_tool(self.jobs, self.planner, self.pushes.job_changed))
        self.runner.commands = JobCommands(jobs=self.jobs, planner=self.planner, service=self.pushes).handle
        self.bus = SessionBus(
            store=self.store, run_turn=self.runner.run, workers=self._workers, instance_id=self.instance_id,
            lease_s=config.bus.lease_s, sweep_interval_s=config.bus.sweep_interval_s,
            busy_policy=config.bus.busy_policy,
            on_turn_start=self._typing_start, on_turn_end=self._typing_end, on_replies=self.delivery.wake,
        )
        self._typing: dict[ChatAddress, asyncio.Task[None]] = {}
        self._receivers: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.http_port: int | None = None
        self.received = 0
        self.duplicates = 0

    async def run_db(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs a blocking store call off the main loop (on the small DB pool)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db_pool, functools.partial(fn, *args))

    # -- inbound -----------------------------------------------------------------------------
    async def receive(self, message: InboundMessage) -> bool:
        """The adapters' sink: stores ``message`` in the inbox (dedupe) and schedules its lane.

        Returns ``False`` for a duplicate or an unaddressed message in a conversation the bot is
        not part of. Raises if the database write failed (the adapter must
        not acknowledge the platform then).
        """
        key = session_key_for(message)
        if not message.addressed and not await self.run_db(self.store.lane_exists, key):
            return False  # a thread message not for us: the bot is not part of that thread
        if message.command in CONTROL_COMMANDS:
            stored = await self._control(message, key)
        else:
            cancel = "if_busy" if self.config.bus.busy_policy == "interrupt" else None
            stored = await self.run_db(functools.partial(self.store.insert_inbound, message, key, cancel=cancel))
        if stored:
            self.received += 1
            self.bus.kick(key)
        else:
            self.duplicates += 1
        return stored

    async def _control(self, message: InboundMessage, key: str) -> bool:
        """``/stop``: cancels the running turn (it stops at its next step and sends nothing) and
        answers at once, without waiting for the lane."""
        assert message.command is not None
        was_running = await self.run_db(self.store.lane_busy, key)
        digest = hashlib.sha256(f"{message.platform}:{message.address.tenant}:{message.message_id}".encode())
        reply = OutboundMessage(message.address, control_reply(message.command, was_running),
                                idempotency_key=f"ctl:{digest.hexdigest()[:40]}", reply_to_id=message.reply_to_id)
        stored = await self.run_db(functools.partial(self.store.insert_inbound, message, key, cancel="always",
                                                     control_reply=reply))
        if stored:
            self.delivery.wake()
        return stored

    async def _hold_receiver(self, adapter: Adapter) -> None:
        """Receives on ``adapter`` only while this instance holds its receiver lease (Telegram
        long polling: one poller per bot across instances; the others stand by)."""
        name = adapter.receiver_lease
        assert name is not None
        lease_s = self.config.bus.lease_s
        receiving = False
        try:
            while True:
                try:
                    if receiving:
                        held = name in await self.run_db(self.store.renew_lanes, [name], self.instance_id, lease_s)
                    else:
                        held = await self.run_db(self.store.claim_lane, name, self.instance_id, lease_s)
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
                await self.run_db(self.store.release_lane, name, self.instance_id)

    # -- typing indicator ----------------------------------------------------------------------
    def _typing_start(self, address: ChatAddress) -> None:
        adapter = self.adapters.get(address.platform)
        if adapter is None or address in self._typing:
            return

        async def keep_typing() -> None:
            while True:
                if not self.delivery.chat_waiting(address.platform, address.tenant, address.chat_id):
                    await adapter.send_typing(address)
                await asyncio.sleep(TYPING_INTERVAL_S)

        self._typing[address] = asyncio.create_task(keep_typing())

    def _typing_end(self, address: ChatAddress) -> None:
        task = self._typing.pop(address, None)
        if task is not None:
            task.cancel()

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Migrates the database, starts the bridge, HTTP server, bus, delivery and adapters."""
        await self.run_db(upgrade, self.engine)
        self.bridge.start()
        await self.bus.start()
        await self.delivery.start()
        if self.pushes is not None:
            await self.pushes.start()
        if self.serve_http:
            routes = [route for adapter in self.adapters.values() for route in adapter.routes()]
            app = build_app(routes, self._ready, self._metrics)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.config.http.host, self.config.http.port)
            await site.start()
            self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            log.info("http server on %s:%s", self.config.http.host, self.http_port)
        for adapter in self.adapters.values():
            await adapter.start(self.receive)
            if getattr(adapter, "receiver_lease", None):
                self._receivers.append(asyncio.create_task(self._hold_receiver(adapter)))
            else:
                await adapter.start_receiving()
        log.info("gateway %s started with %s", self.instance_id, ", ".join(self.adapters) or "no platforms")

    async def stop(self) -> None:
        """Stops receiving first, then lets running turns finish their step, then closes."""
        for task in self._receivers:
            task.cancel()
        await asyncio.gather(*self._receivers, return_exceptions=True)
        self._receivers.clear()
        for adapter in self.adapters.values():
            try:
                await adapter.stop()
            except Exception:
                log.exception("adapter %s did not stop cleanly", adapter.platform)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.pushes is not None:
            await self.pushes.stop()
        await self.bus.stop()
        for task in self._typing.values():
            task.cancel()
        self._typing.clear()
        await asyncio.get_running_loop().run_in_executor(None, functools.partial(self._workers.shutdown, wait=True))
        await self.delivery.stop()
        self.bridge.stop()
        self._db_pool.shutdown(wait=True)
        self.engine.dispose()

    async def _ready(self) -> bool:
        try:
            await self.run_db(self.store.count_inbox, "pending")
        except Exception:
            return False
        return True

    def _metrics(self) -> str:
        lines = [
            "# TYPE gateway_inbound_total counter", f"gateway_inbound_total {self.received}",
            "# TYPE gateway_inbound_duplicates_total counter", f"gateway_inbound_duplicates_total {self.duplicates}",
            "# TYPE gateway_turns_total counter", f"gateway_turns_total {self.bus.turns_done}",
            "# TYPE gateway_deliveries_total counter", f"gateway_deliveries_total {self.delivery.sent}",
            "# TYPE gateway_push_runs_total counter",
            f"gateway_push_runs_total {self.pushes.fired if self.pushes else 0}",
        ]
        return "\n".join(lines) + "\n"
