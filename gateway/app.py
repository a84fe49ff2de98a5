"""``Gateway``: builds the stores, agent, bus and delivery around a set of adapters; start/stop.

Threads (DESIGN §2): the main asyncio loop (HTTP server, adapters, bus scheduling, delivery),
a worker pool for turns, a small pool for the main loop's database calls, and the AsyncBridge.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from aiohttp import web

from agent.bridge import AsyncBridge
from agent.browser import BrowserTools
from agent.cache import AgentCache, AgentSpec
from agent.delegate import delegate_tool
from agent.mcp import McpClients, McpServerSpec
from agent.model import ChatModel, OpenAIChatModel
from agent.plan import update_plan_tool
from agent.redact import Redactor
from agent.sandbox import Sandbox
from agent.skills import SkillLibrary, load_skill_tool, with_catalogue
from agent.tools import ToolRegistry
from agent.web import WebFetcher
from agent.workspace import Workspace
from gateway.access import admin_pages_on, decide, is_admin, may_run_guarded_tools
from gateway.admin.views import admin_routes
from gateway.approvals import ApprovalPolicy, decide_reply
from gateway.bus import SessionBus
from gateway.commands import CONTROL_COMMANDS, CommandContext, Commands, control_reply
from gateway.config import GatewayConfig
from gateway.conversations import TranscriptReader
from gateway.delivery import Delivery
from gateway.http import build_app
from gateway.instance import InstanceGuard, default_instance_id, exit_now
from gateway.job_commands import JobCommands
from gateway.job_tool import schedule_report_tool
from gateway.jobs import JobPlanner
from gateway.memory.build import build_memory, first_answer
from gateway.memory.commands import MemoryCommands
from gateway.memory.tools import memory_tools
from gateway.metrics import CONTENT_TYPE, GatewayMetrics, MeteredModel, timed
from gateway.ports import Adapter
from gateway.push_run import PushRunner
from gateway.pushes import PushService
from gateway.resets import ResetPolicy
from gateway.sessions import is_dm_key, session_key_for
from gateway.store.approvals import Approvals
from gateway.store.db import create_db_engine, upgrade
from gateway.store.directory import Directory, Identity
from gateway.store.instances import InstanceStore
from gateway.store.jobs import JobStore
from gateway.store.sql import Store
from gateway.store.text import storable_inbound
from gateway.streaming import StreamHub
from gateway.telemetry import span as traced
from gateway.turns import TurnRunner
from gateway.types import ChatAddress, InboundMessage, OutboundMessage

log = logging.getLogger("gateway")
T = TypeVar("T")

TYPING_INTERVAL_S = 4.0  # Telegram shows "typing" for ≤ 5 s (Bot API: sendChatAction)
TYPING_DELAY_S = 0.5  # a reply faster than this needs no indicator (and saves a platform call)
SEND_GRACE_S = 5.0
"""A send still in flight at the stop deadline gets this long to finish (a send cut mid-call is
recorded ``unconfirmed`` and never repeated, so it may be lost)."""


PAIRING_TEXT = (
    "Hello! I don't know you yet. Ask an admin to approve you with this code: {code}\n"
    "(They send /approve_user {code} to me, or run: gateway pairing approve {code})"
)


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
        self.instance_id = config.instance_id or default_instance_id(config.database.url)
        self.adapters = {adapter.platform: adapter for adapter in adapters}
        self.serve_http = serve_http
        self.engine = create_db_engine(config.database.url, config.database.pool_size)
        self.instance = InstanceGuard(InstanceStore(self.engine), self.instance_id, self.run_db,
                                      on_lost=exit_now(self.instance_id))
        for adapter in adapters:  # channels that show the conversation themselves (the web chat)
            if callable(getattr(adapter, "bind_conversations", None)):
                adapter.bind_conversations(TranscriptReader(self.engine, self.run_db))  # type: ignore[attr-defined]
        self.store = Store(self.engine)
        self.jobs = JobStore(self.engine)
        self.bridge = AsyncBridge()
        self.metrics = GatewayMetrics()
        self.redact = Redactor(config.secret_values())
        self.mcp = McpClients(mcp_specs(config), self.bridge)
        self.tools = build_catalog(config, self.bridge)
        self.skills = SkillLibrary(config.skills.dirs()) if config.skills.enabled else None
        if self.skills is not None:
            self.tools.add(load_skill_tool(self.skills))
        if config.skills.plan:
            self.tools.add(update_plan_tool())
        push_tools = ToolRegistry()  # a push's "default" toolset: the chat tools minus chat-only ones
        for tool in self.tools.tools.values():
            push_tools.add(tool)
        toolsets = {"default": push_tools, "none": ToolRegistry()}
        self.planner = JobPlanner(self.jobs, platforms=self.adapters, operators=config.scheduler.operators,
                                  toolsets=toolsets)
        self.pushes: PushService | None = None
        if config.scheduler.enabled:
            self.tools.add(schedule_report_tool(self.jobs, self.planner,
                                                lambda: self.pushes.job_changed() if self.pushes else None))
        # Long-term memory: its tools are chat-only (a push has no user to remember for).
        self.memory = build_memory(config, self.engine, self.store, lambda: self.model) \
            if config.memory.enabled else None
        for tool in memory_tools(self.memory) if self.memory is not None else []:
            self.tools.add(tool)
        api_key = config.secret(config.llm.api_key_env)
        self.missing_model_key = None if api_key else config.llm.api_key_env
        api_key = api_key or "missing-api-key"  # servers that need no key still answer

        limits = config.agent.limits()

        def build_model(spec: AgentSpec) -> ChatModel:
            inner = model if model is not None else OpenAIChatModel(
                base_url=spec.base_url, api_key=spec.api_key, model=spec.model, timeout_s=config.llm.timeout_s,
                max_retries=config.llm.max_retries, temperature=config.llm.temperature, stream=config.llm.stream,
                missing_key=self.missing_model_key)
            return MeteredModel(inner, self.metrics, limits.price_of(spec.model))

        self.agents = AgentCache(self.tools, build_model)
        toolset = expand_toolset(config.agent.toolset, config.tools.toolsets) \
            if config.agent.toolset is not None else list(self.tools.tools)
        self.agent_spec = AgentSpec(model=config.llm.model, base_url=config.llm.base_url, api_key=api_key,
                                    toolset=tuple(toolset))
        self.streams = StreamHub(
            store=self.store, adapters=self.adapters,
            platforms=set(config.agent.streaming) if config.llm.stream else set(),
            first_after_s=config.agent.stream_first_after_s, intervals=config.agent.stream_edit_interval_s,
            chat_waiting=lambda a: self.delivery.chat_waiting(a.platform, a.tenant, a.chat_id),
        )
        self.directory = Directory(self.engine)
        sessions = config.sessions
        self.approvals = Approvals(self.engine)
        self._loop: asyncio.AbstractEventLoop | None = None
        policy = ApprovalPolicy(require_for=frozenset(config.approvals.require_for),
                                dangerous_shell=tuple(re.compile(p) for p in config.approvals.dangerous_shell_patterns),
                                timeout_s=config.approvals.timeout_s,
                                admin_reachable=bool(config.access.admins) or admin_pages_on(config))
        self.runner = TurnRunner(
            approvals=self.approvals, policy=policy, redact=self.redact, wake=self._wake_delivery,
            store=self.store, agents=self.agents, spec=self.agent_spec, bridge=self.bridge,
            limits=limits, history_window=config.agent.history_window,
            system_prompt=self.build_system_prompt, streams=self.streams,
            commands=Commands(self.store, self.directory, self.build_system_prompt, skills=self.skills,
                              skill_tools=lambda: self.agent_spec.toolset),
            is_admin=lambda message: is_admin(message, config.access),
            reset=ResetPolicy(idle_s=sessions.idle_reset_minutes * 60 if sessions.idle_reset_minutes else None,
                              daily_hour=sessions.daily_reset_hour, zone=sessions.reset_timezone)
            if sessions.idle_reset_minutes or sessions.daily_reset_hour is not None else None,
            window=config.llm.window_policy(),
            metrics=self.metrics, memory=self.memory,
            trusted=lambda message, user_id: self._trusted(message),
        )
        self._workers = ThreadPoolExecutor(config.agent.worker_threads, thread_name_prefix="turn")
        self._db_pool = ThreadPoolExecutor(4, thread_name_prefix="db")
        self.delivery = Delivery(
            store=self.store, adapters=self.adapters, instance_id=self.instance_id, run_db=self.run_db,
            max_attempts=config.delivery.max_attempts, backoff_base_s=config.delivery.backoff_base_s,
            backoff_max_s=config.delivery.backoff_max_s, claim_s=config.delivery.claim_s, metrics=self.metrics,
        )
        if config.scheduler.enabled:
            sc = config.scheduler
            self.pushes = PushService(
                jobs=self.jobs, runner=PushRunner(turns=self.runner, jobs=self.jobs, toolsets=toolsets),
                run_db=self.run_db, workers=self._workers, instance_id=self.instance_id, on_queued=self.delivery.wake,
                misfire_grace_s=sc.misfire_grace_s, claim_timeout_s=sc.claim_timeout_s,
                reload_interval_s=sc.reload_interval_s,
                on_fired=lambda status: self.metrics.scheduled_fires.labels(status).inc(),
            )
        self.runner.job_commands = first_answer(
            [JobCommands(jobs=self.jobs, planner=self.planner, service=self.pushes).handle]
            + ([MemoryCommands(self.memory).handle] if self.memory is not None else []))
        self.bus = SessionBus(
            store=self.store, run_turn=timed(self.metrics, self.runner.run), workers=self._workers,
            instance_id=self.instance_id,
            lease_s=config.bus.lease_s, sweep_interval_s=config.bus.sweep_interval_s,
            busy_policy=config.bus.busy_policy,
            on_turn_start=self._typing_start, on_turn_end=self._typing_end, on_replies=self.delivery.wake,
        )
        self._typing: dict[ChatAddress, asyncio.Task[None]] = {}
        self._receivers: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.http_port: int | None = None
        self.started = False
        """Every adapter has started and no stop has begun: ``/readyz`` is 200 and webhooks are
        accepted only while this is set."""
        self.unfinished_turns = 0
        """Turns still running when a stop's deadline passed (they resume after the restart)."""
        self.received = 0
        self.duplicates = 0
        self.dropped = 0

    def _trusted(self, message: InboundMessage) -> bool:
        """May the sender run tools that need approval and approve them (blocking: a DB read in
        open access)? See ``gateway.access.may_run_guarded_tools``."""
        access = self.config.access
        return access.mode != "open" or is_admin(message, access) or may_run_guarded_tools(
            message, self.directory.identify(message).approved, access)

    def build_system_prompt(self) -> str:
        """A new session's system prompt: the configured one plus the skill catalogue as it is on
        disk now (for the tools chat turns mount). Stored with the session, never rebuilt for it."""
        toolset = self.agent_spec.toolset
        catalogue = self.skills.catalogue(toolset) if self.skills is not None and "load_skill" in toolset else ""
        return with_catalogue(self.config.agent.system_prompt, catalogue)

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
        with traced(f"receive {message.platform}",
                                          attributes={"gateway.platform": message.platform}) as span:
            stored = await self._receive(message)
            span.set_attribute("gateway.stored", stored)
            return stored

    def _admit(self, message: InboundMessage) -> tuple[Identity, str, str, bool | None]:
        """The database part of receiving, in one call on the DB pool (one thread hop for an
        ordinary message): ``(identity, session key, decision, stored)``. ``decision`` is the access
        decision, or ``unaddressed`` for a thread message not for us; ``stored`` is whether an
        allowed non-control message went into the inbox (``None``: not stored here)."""
        identity = self.directory.identify(message)
        key = session_key_for(message, identity.user_id, self.config.sessions.group_scope)
        if not message.addressed and not self.store.lane_exists(key):
            return identity, key, "unaddressed", None
        decision = decide(message, identity.approved, self.config.access)
        if decision != "allow" or message.command in CONTROL_COMMANDS:
            return identity, key, decision, None
        cancel = "if_busy" if self.config.bus.busy_policy == "interrupt" else None
        return identity, key, decision, self.store.insert_inbound(message, key, cancel=cancel,
                                                                  user_id=identity.user_id)

    async def _receive(self, message: InboundMessage) -> bool:
        message = storable_inbound(message)  # every string, not only the text: ids, names, tenant
        redacted = self.redact(message.text)  # a pasted secret is never stored, not even in the inbox
        if redacted != message.text:
            message = dataclasses.replace(message, text=redacted)
        identity, key, decision, stored = await self.run_db(self._admit, message)
        if decision == "unaddressed":
            self.dropped += 1
            self.metrics.dropped.labels(message.platform).inc()
            return False  # a thread message not for us: the bot is not part of that thread
        if decision == "deny":
            log.info("message from %s in %s not allowed (access.mode = allowlist)",
                     message.sender.user_id, message.address.chat_id)
            self.dropped += 1
            self.metrics.dropped.labels(message.platform).inc()
            return False
        if decision == "pair":
            code = await self.run_db(self.directory.new_code, identity.user_id, "pairing")
            stored = await self._answer_now(message, key, identity.user_id, PAIRING_TEXT.format(code=code))
        elif message.command in CONTROL_COMMANDS:
            stored = await self._control(message, key, identity.user_id)
        elif stored and self.config.bus.busy_policy == "interrupt":  # stored by _admit
            self.runner.note_generation(key, await self.run_db(self.store.lane_generation, key))
        if stored:
            self.received += 1
            self.metrics.inbound.labels(message.platform).inc()
            self.bus.kick(key)
        else:
            self.duplicates += 1
            self.metrics.duplicates.labels(message.platform).inc()
        return bool(stored)

    async def _control(self, message: InboundMessage, key: str, user_id: str) -> bool:
        """``/stop``: cancels the running turn (it stops at its next step and sends nothing) and
        answers at once, without waiting for the lane. ``/status`` answers at once too (it only
        reads), so it shows the plan of a turn still running. ``/approve ID`` / ``/deny ID`` decide a
        pending approval (the waiting turn reads it from the database) and never cancel."""
        assert message.command is not None
        if message.command == "status":  # read-only: answered at once, a running turn's plan included
            ctx = CommandContext(message, key, user_id, is_dm_key(key), is_admin(message, self.config.access),
                                 self.agent_spec.model)
            commands = self.runner.commands
            text = await self.run_db(commands.run, ctx) if commands is not None else None
            return await self._answer_now(message, key, user_id, text or "No status here.")
        if message.command in ("approve", "deny"):
            text = await self.run_db(lambda: decide_reply(self.approvals, message.command, message.text, user_id,
                                                          is_admin(message, self.config.access),
                                                          self._trusted(message)))
            return await self._answer_now(message, key, user_id, text)
        was_running = await self.run_db(self.store.lane_busy, key)
        stored = await self._answer_now(message, key, user_id, control_reply(message.command, was_running),
                                        cancel="always")
        if stored:
            self.runner.note_generation(key, await self.run_db(self.store.lane_generation, key))
        return stored

    async def _answer_now(self, message: InboundMessage, key: str, user_id: str, text: str,
                          cancel: str | None = None) -> bool:
        """Stores ``message`` as handled and queues ``text`` as its reply, outside the lane."""
        digest = hashlib.sha256(f"{message.platform}:{message.address.tenant}:{message.message_id}".encode())
        reply = OutboundMessage(message.address, text, idempotency_key=f"ctl:{digest.hexdigest()[:40]}",
                                reply_to_id=message.reply_to_id)
        stored = await self.run_db(functools.partial(self.store.insert_inbound, message, key, cancel=cancel,
                                                     control_reply=reply, user_id=user_id))
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

    def _wake_delivery(self) -> None:
        """Thread-safe ``delivery.wake`` (worker threads queue approval prompts)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.delivery.wake)

    # -- typing indicator ----------------------------------------------------------------------
    def _typing_start(self, address: ChatAddress) -> None:
        adapter = self.adapters.get(address.platform)
        if adapter is None or address in self._typing:
            return

        async def keep_typing() -> None:
            await asyncio.sleep(TYPING_DELAY_S)
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
        """Migrates the database, starts the bridge, bus, delivery, HTTP server and adapters.

        The HTTP server opens before the adapters start (``/healthz`` answers, ``/readyz`` and
        every webhook get 503) and accepts events once ``started`` is set, after the last
        adapter has started: an event acknowledged earlier could be misjudged (a Feishu group
        mention before the bot's open_id is known would be dropped as not addressed)."""
        await self.run_db(upgrade, self.engine)
        await self.instance.acquire()  # InstanceInUse if a live process holds our id; else its leases are ours
        if self.missing_model_key:
            log.warning("%s is not set: model calls to %s go without an API key and fail unless that server "
                        "needs none. Set %s to the key (llm.api_key_env names the variable).",
                        self.missing_model_key, self.config.llm.base_url, self.missing_model_key)
        self._loop = asyncio.get_running_loop()
        self.bridge.start()
        discovered = await self.mcp.discover(self.config.mcp.startup_timeout_s)
        for tool in discovered:
            if self.tools.get(tool.name) is None:
                self.tools.add(tool)
        if discovered and self.config.agent.toolset is None:  # "every tool" includes the MCP ones
            self.agent_spec = dataclasses.replace(self.agent_spec, toolset=tuple(self.tools.tools))
            self.runner.spec = self.agent_spec
        self.streams.bind(asyncio.get_running_loop())
        await self.bus.start()
        await self.delivery.start()
        if self.pushes is not None:
            await self.pushes.start()
        if self.serve_http:
            routes = [route for adapter in self.adapters.values() for route in adapter.routes()]
            routes += admin_routes(self)
            app = build_app(routes, self._ready, self._metrics, CONTENT_TYPE, accepting=lambda: self.started)
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
        self.started = True
        log.info("gateway %s started with %s", self.instance_id, ", ".join(self.adapters) or "no platforms")

    async def stop(self) -> None:
        """Graceful stop, bounded by ``config.stop_timeout_s`` (SIGTERM in ``gateway run``):

        1. stop receiving: ``/readyz`` and every webhook answer 503 (the platforms redeliver, to
           another instance behind a load balancer), pollers and sockets close, receiver leases
           are given up, no scheduled report fires, no new turn starts;
        2. running turns finish their step: a final answer is queued, a turn that would call the
           model again stops there (``TurnInterrupted``) and resumes from the transcript at the
           next start;
        3. the outbox drains: replies due now and retries due before the deadline go out while
           the adapters' clients are still open;
        4. then the adapters close, then the HTTP server, the bus, the pools and the database.

        What the deadline cuts stays durable: a turn still running has its rows pending (it is
        run again after the restart; ``unfinished_turns`` counts them), a reply not yet sent
        stays in the outbox; either is delivered exactly once after the restart.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.stop_timeout_s
        self.started = False  # /readyz and the webhooks answer 503 from here on
        self.runner.stopping.set()
        self.bus.begin_stop()
        for task in self._receivers:
            task.cancel()
        await asyncio.gather(*self._receivers, return_exceptions=True)
        self._receivers.clear()
        for adapter in self.adapters.values():
            try:
                await adapter.stop_receiving()
            except Exception:
                log.exception("adapter %s did not stop receiving cleanly", adapter.platform)
        if self.pushes is not None:
            await self.pushes.stop()
        if not await self.bus.wait_idle(max(0.0, deadline - loop.time())):
            self.unfinished_turns = self.bus.running
            log.warning("stop: %d turn(s) still running after stop_timeout_s = %s; they resume after the restart",
                        self.unfinished_turns, self.config.stop_timeout_s)
        if not await self.delivery.drain(max(0.0, deadline - loop.time())):
            log.warning("stop: replies still queued at the stop timeout; they are delivered after the restart")
        await self.delivery.stop(grace_s=max(SEND_GRACE_S, deadline - loop.time()))
        for task in self._typing.values():
            task.cancel()
        self._typing.clear()
        for adapter in self.adapters.values():
            try:
                await adapter.stop()
            except Exception:
                log.exception("adapter %s did not stop cleanly", adapter.platform)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.bus.stop()
        finished = not self.unfinished_turns
        # Turns the deadline cut keep their threads; ``gateway run`` exits without waiting for them.
        await loop.run_in_executor(None, functools.partial(self._workers.shutdown, wait=finished,
                                                           cancel_futures=True))
        if self.memory is not None and finished:  # queued write-backs finish first
            await loop.run_in_executor(None, self.memory.close)
        self.bridge.stop()
        await self.instance.release()  # last: nothing of ours holds a lease now
        self._db_pool.shutdown(wait=True)
        self.engine.dispose()

    @property
    def model(self) -> ChatModel:
        """The chat turns' model client (from the agent cache)."""
        return self.agents.get(self.agent_spec).model

    async def _ready(self) -> bool:
        """Ready = every adapter started and the database answers."""
        if not self.started:
            return False
        try:
            await self.run_db(self.store.count_inbox, "pending")
        except Exception:
            return False
        return True

    async def _metrics(self) -> bytes:
        """Reads the database-backed gauges, then renders every metric (a DB fault leaves them stale)."""
        try:
            pending = await self.run_db(self.store.count_inbox, "pending")
            leases = await self.run_db(self.store.count_leases, time.time())
            outbox = await self.run_db(self.store.outbox_counts)
            self.metrics.refresh(pending, leases, outbox)
        except Exception:
            log.exception("metrics: database gauges not refreshed")
        return self.metrics.render()


def expand_toolset(names: Sequence[str], toolsets: dict[str, list[str]]) -> list[str]:
    """Tool names for ``agent.toolset`` entries: a toolset's name stands for its tools (one level)."""
    out: list[str] = []
    for name in names:
        out.extend(toolsets.get(name, [name]))
    return sorted(set(out))


def build_catalog(config: GatewayConfig, bridge: AsyncBridge) -> ToolRegistry:
    """Every tool this process offers: ``web_fetch``, ``delegate``, the workspace tools of the
    configured rung, and the browser tools when the configured Chromium exists. Agents mount
    subsets of it (``agent.toolset``); MCP tools are added once discovered."""
    tools = ToolRegistry()
    for tool in build_workspace(config).tools() if config.tools.workspace != "off" else []:
        tools.add(tool)
    tools.add(WebFetcher(bridge, allow_private=config.tools.web_fetch_allow_private,
                         max_bytes=config.tools.web_fetch_max_bytes).tool())
    if config.tools.delegate_enabled:
        tools.add(delegate_tool())
    if config.tools.browser_enabled:
        if os.path.exists(config.tools.browser_executable):
            browser = BrowserTools(bridge, executable_path=config.tools.browser_executable,
                                   idle_s=config.tools.browser_idle_s, allow_private=config.tools.browser_allow_private,
                                   timeout_s=config.tools.browser_timeout_s)
            for tool in browser.tools():
                tools.add(tool)
        else:
            log.warning("browser tools off: %s not found (install the Debian package chromium)",
                        config.tools.browser_executable)
    return tools


def mcp_specs(config: GatewayConfig) -> list[McpServerSpec]:
    """The enabled MCP servers (header values read from their environment variables)."""
    specs = []
    for name, server in sorted(config.mcp.servers.items()):
        if not server.enabled:
            continue
        headers = {header: config.secret(env) or "" for header, env in server.headers_env.items()}
        specs.append(McpServerSpec(name=name, command=server.command, env=dict(server.env), url=server.url,
                                   headers=headers, timeout_s=server.timeout_s))
    return specs


def build_workspace(config: GatewayConfig) -> Workspace:
    """The workspace (and its shell sandbox) as configured; ``tools.workspace`` is its rung."""
    t = config.tools
    sandbox = Sandbox(timeout_s=t.shell_timeout_s, max_output_bytes=t.shell_max_output_bytes, cpu_s=t.shell_cpu_s,
                      memory_bytes=t.shell_memory_mb << 20, allow_network=t.shell_allow_network,
                      use_namespaces=t.workspace == "shell")
    return Workspace(t.workspace_root, "read" if t.workspace == "off" else t.workspace, sandbox=sandbox)
