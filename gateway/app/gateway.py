"""``Gateway``: builds the stores, agent, bus and delivery around a set of adapters; start/stop.

Threads (DESIGN §2): the main asyncio loop (HTTP server, adapters, bus scheduling, delivery),
a worker pool for turns, a small pool for the main loop's database calls, and the AsyncBridge.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from aiohttp import web

from agent.bridge import AsyncBridge
from agent.cache import AgentCache, AgentSpec
from agent.mcp import McpClients
from agent.model import ChatModel, OpenAIChatModel
from agent.plan import update_plan_tool
from agent.providers import Target, split_target
from agent.redact import Redactor
from agent.routing import HealthBoard, HealthSettings, RoutedModel
from agent.skills import SkillLibrary, load_skill_tool
from agent.tools import ToolRegistry
from gateway.admin.views import admin_routes
from gateway.app.loops import running_loop_name
from gateway.bus.conversation import ConversationContext
from gateway.bus.lanes import SessionBus
from gateway.bus.pool import TurnPool
from gateway.bus.turns import TurnRunner
from gateway.core.config import GatewayConfig
from gateway.core.ports import Adapter, can_send_files
from gateway.core.types import ChatAddress, InboundMessage
from gateway.delivery.files import BlobFiles, OutboxFiles
from gateway.delivery.outbox import Delivery
from gateway.delivery.send_file import send_file_tool
from gateway.delivery.streaming import StreamHub
from gateway.delivery.typing import TypingIndicators
from gateway.inbound.access import admin_pages_on, is_admin
from gateway.inbound.receive import Inbound
from gateway.inbound.receivers import hold_receiver
from gateway.media.commands import MediaCommands
from gateway.media.contents import ContentReader
from gateway.media.fetch import GuardedFetch
from gateway.media.index import MediaIndex, move_user_files
from gateway.media.isolated import MediaReaders
from gateway.media.service import MediaService
from gateway.media.store import open_blob_store
from gateway.media.transcribe import build_transcriber
from gateway.memory.build import build_memory
from gateway.memory.commands import MemoryCommands
from gateway.memory.store import move_user_entries
from gateway.memory.tools import memory_tools
from gateway.ops.http import build_app
from gateway.ops.instance import InstanceGuard, default_instance_id, exit_now
from gateway.ops.instance_store import InstanceStore
from gateway.ops.metrics import CONTENT_TYPE, GatewayMetrics, MeteredModel, timed
from gateway.ops.usage_limits import UsageLimits
from gateway.scheduler.commands import JobCommands
from gateway.scheduler.planner import JobPlanner
from gateway.scheduler.push_run import PushRunner
from gateway.scheduler.service import PushService
from gateway.scheduler.store import JobStore
from gateway.scheduler.tool import schedule_report_tool
from gateway.sessions.chat_settings import ChatCommands, ChatOverrides, ChatSetup, session_skills
from gateway.sessions.commands import Commands, first_answer
from gateway.sessions.conversations import TranscriptReader
from gateway.sessions.directory import Directory
from gateway.sessions.group_context import GroupContextStore
from gateway.sessions.resets import ResetPolicy
from gateway.store.db import close_now_connection, create_db_engine, upgrade, write_now
from gateway.store.offload import Offload
from gateway.store.outbox import OutboxItem
from gateway.store.prune import prune_settled
from gateway.store.sql import Store
from gateway.tools.approvals import ApprovalPolicy
from gateway.tools.approvals_store import Approvals
from gateway.tools.catalog import build_catalog, build_workspace, expand_toolset, mcp_specs

log = logging.getLogger("gateway")
T = TypeVar("T")

HOUSEKEEPING_INTERVAL_S = 3600.0
SEND_GRACE_S = 5.0
"""A send still in flight at the stop deadline gets this long to finish (a send cut mid-call is
recorded ``unconfirmed`` and never repeated, so it may be lost)."""

GROUP_CONTEXT_SWEEP_S = 600.0
"""How often kept group messages past ``sessions.group_context_hours`` are deleted."""


class Gateway:
    """The host process.

    Args:
        config: the loaded configuration.
        adapters: the platform adapters to run (built by ``gateway.app.wiring``).
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
        self.instance = InstanceGuard(InstanceStore(self.engine, config.bus.max_turn_crashes), self.instance_id,
                                      self.run_db, on_lost=exit_now(self.instance_id))
        for adapter in adapters:  # channels that show the conversation themselves (the web chat)
            if callable(getattr(adapter, "bind_conversations", None)):
                adapter.bind_conversations(TranscriptReader(self.engine, self.run_db))  # type: ignore[attr-defined]
            if callable(getattr(adapter, "bind_chat_left", None)):  # the bot was removed: forget the chat
                adapter.bind_chat_left(self._chat_left)  # type: ignore[attr-defined]
        self.store = Store(self.engine)
        self.blobs = open_blob_store(config.media, self.engine)
        self.redact = Redactor(config.secret_values())
        self.media_readers = MediaReaders(config.media.reader_processes, config.media.reader_timeout_s,
                                          config.media.reader_memory_mb << 20)
        # Set once every adapter has started: a turn resumed at start-up (the bus starts first) waits
        # for it before it downloads a file (the adapter's client does not exist before).
        self.adapters_ready = threading.Event()
        reader = ContentReader(  # voice, audio, documents; originals into the workspace
            transcriber=build_transcriber(config.llm, config.secret),
            workspace=build_workspace(config) if config.tools.workspace != "off" else None,
            max_tokens=config.media.document_max_tokens, redact=self.redact, readers=self.media_readers)
        self.media = MediaService(config.media, vision=config.llm.vision, blobs=self.blobs, readers=self.media_readers,
                                  adapters_ready=self.adapters_ready.wait,
                                  index=MediaIndex(self.engine, self.blobs, forget_saved=reader.forget_saved),
                                  adapters=self.adapters, run_async=self._run_on_loop, reader=reader)
        for adapter in adapters:  # channels that take uploads themselves (the web chat)
            if callable(getattr(adapter, "bind_blobs", None)):
                adapter.bind_blobs(self.blobs, config.media)  # type: ignore[attr-defined]
            if callable(getattr(adapter, "bind_fetch", None)):  # adapters handed file URLs (Slack)
                adapter.bind_fetch(GuardedFetch())  # type: ignore[attr-defined]
        self.jobs = JobStore(self.engine)
        self.bridge = AsyncBridge()
        self.metrics = GatewayMetrics()
        self.mcp = McpClients(mcp_specs(config), self.bridge)
        self.tools = build_catalog(config, self.bridge)
        self.skills = SkillLibrary(config.skills.dirs()) if config.skills.enabled else None
        if self.skills is not None:
            self.tools.add(load_skill_tool(self.skills, allowed=lambda ctx: session_skills(self.store, ctx.session_id)))
        if config.skills.plan:
            self.tools.add(update_plan_tool())
        # Files back (send_file): bytes in the blob store, the call recorded, the reply carries them.
        self.outbox_files = OutboxFiles(self.engine)
        for adapter in adapters:
            if can_send_files(adapter):
                adapter.bind_files(BlobFiles(self.blobs))  # type: ignore[attr-defined]
        if config.tools.workspace != "off":  # chat turns and scheduled reports alike
            self.tools.add(send_file_tool(workspace=build_workspace(config), blobs=self.blobs,
                                          files=self.outbox_files, adapters=lambda: self.adapters))
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
        llm = config.llm
        self.providers = llm.build_providers(config.secret)  # keys are read once, here
        # Turn workers: elastic up to agent.max_turns_in_flight; a turn waiting for a provider's
        # max_concurrency slot is parked (not in flight), so a slow provider cannot hold them all.
        self._workers = TurnPool(config.agent.turns_in_flight(), warm=config.agent.warm_threads(), name="turn")
        self.provider_health = HealthBoard(self.providers, HealthSettings(
            failures_to_open=llm.breaker_failures, open_s=llm.breaker_open_s,
            rate_limit_cooldown_s=llm.rate_limit_cooldown_s, auth_recheck_s=llm.auth_recheck_s),
            waiting=self._workers.parked)
        self.missing_model_keys = {name: p.key_env for name in llm.routed_providers()
                                   if (p := self.providers[name]).key_missing and p.key_env}
        """Provider -> the unset variable that should hold its key (servers that need none still answer)."""
        primary = llm.targets(self.providers)[0]
        limits = config.agent.limits()
        limits = dataclasses.replace(limits, prices={**limits.prices, **llm.provider_prices()})

        def build_model(spec: AgentSpec) -> ChatModel:
            if model is not None:
                return MeteredModel(model, self.metrics, limits)
            targets = [Target(self.providers[provider], name) for provider, name in map(split_target, spec.route)]
            route = next((name for name in llm.route_names()
                          if [t.name for t in llm.targets(self.providers, name)] == list(spec.route)), "custom")
            return MeteredModel(RoutedModel(route, targets, self._model_client, self.provider_health,
                                            self.metrics.routes), self.metrics, limits)

        self.agents = AgentCache(self.tools, build_model)
        toolset = expand_toolset(config.agent.toolset, config.tools.toolsets) \
            if config.agent.toolset is not None else list(self.tools.tools)
        self.agent_spec = AgentSpec(model=primary.model, base_url=primary.provider.base_url,
                                    api_key=primary.provider.api_key, toolset=tuple(toolset),
                                    route=tuple(t.name for t in llm.targets(self.providers)))
        self.streams = StreamHub(
            store=self.store, adapters=self.adapters,
            platforms=set(config.agent.streaming) if config.llm.stream else set(),
            first_after_s=config.agent.stream_first_after_s, intervals=config.agent.stream_edit_interval_s,
            chat_waiting=lambda a: self.delivery.chat_waiting(a.platform, a.tenant, a.chat_id),
            submit_db=self.submit_db, write_now=self.write_now,
        )
        self.directory = Directory(self.engine, on_join=[move_user_entries, move_user_files])
        # Per-chat settings ([[chats]], /model, /persona, /busy): what a chat's new sessions get.
        self.chats = ChatSetup(config, ChatOverrides(self.engine), self.providers, lambda: self.agent_spec,
                               self.skills)
        sessions = config.sessions
        self.approvals = Approvals(self.engine)
        self._loop: asyncio.AbstractEventLoop | None = None
        policy = ApprovalPolicy(require_for=frozenset(config.approvals.require_for),
                                dangerous_shell=tuple(re.compile(p) for p in config.approvals.dangerous_shell_patterns),
                                timeout_s=config.approvals.timeout_s,
                                admin_reachable=bool(config.access.admins) or admin_pages_on(config))
        # Conversation context: replied-to messages, threads read from the platform, group context.
        self.group_context = GroupContextStore(self.engine)
        self.conversation = ConversationContext(adapters=self.adapters, sessions=sessions,
                                                group_context=self.group_context, redact=self.redact)
        self.runner = TurnRunner(
            approvals=self.approvals, policy=policy, redact=self.redact, wake=self._wake_delivery,
            store=self.store, agents=self.agents, spec=self.agent_spec, bridge=self.bridge,
            limits=limits, history_window=config.agent.history_window,
            system_prompt=self.build_system_prompt, streams=self.streams,
            commands=Commands(self.store, self.directory, self.build_system_prompt, skills=self.skills,
                              skill_tools=lambda: self.agent_spec.toolset, chats=self.chats),
            is_admin=lambda message: is_admin(message, config.access),
            reset=ResetPolicy(idle_s=sessions.idle_reset_minutes * 60 if sessions.idle_reset_minutes else None,
                              daily_hour=sessions.daily_reset_hour, zone=sessions.reset_timezone)
            if sessions.idle_reset_minutes or sessions.daily_reset_hour is not None else None,
            window=config.llm.window_policy(config.llm.route_window()),
            metrics=self.metrics, memory=self.memory,
            trusted=lambda message, user_id: self.inbound.trusted(message), media=self.media,
            conversation=self.conversation, files=self.outbox_files, chats=self.chats,
            deliver=self._deliver_now, claim=(self.instance_id, config.delivery.claim_s),
            usage=UsageLimits(self.engine, config.limits), max_crashes=config.bus.max_turn_crashes,
        )
        self._db_pool = Offload(4, "db")
        self.delivery = Delivery(
            store=self.store, adapters=self.adapters, instance_id=self.instance_id, run_db=self.run_db,
            write_now=self.write_now, submit_db=self.submit_db,
            max_attempts=config.delivery.max_attempts, backoff_base_s=config.delivery.backoff_base_s,
            backoff_max_s=config.delivery.backoff_max_s, claim_s=config.delivery.claim_s, metrics=self.metrics,
            redact=self.redact,
        )
        self.typing = TypingIndicators(self.adapters, lambda a: self.delivery.chat_waiting(a.platform, a.tenant,
                                                                                         a.chat_id))
        if config.scheduler.enabled:
            sc = config.scheduler
            self.pushes = PushService(
                jobs=self.jobs, runner=PushRunner(turns=self.runner, jobs=self.jobs, toolsets=toolsets),
                run_db=self.run_db, workers=self._workers, instance_id=self.instance_id, on_queued=self.delivery.wake,
                misfire_grace_s=sc.misfire_grace_s, claim_timeout_s=sc.claim_timeout_s,
                reload_interval_s=sc.reload_interval_s,
                on_fired=lambda status: self.metrics.scheduled_fires.labels(status).inc(),
                locale=config.i18n.default,
            )
        self.runner.job_commands = first_answer(
            [JobCommands(jobs=self.jobs, planner=self.planner, service=self.pushes).handle]
            + ([MemoryCommands(self.memory).handle] if self.memory is not None else [])
            + [MediaCommands(self.media.index, self.directory, config.media.retention_days).handle]
            + [ChatCommands(self.chats, lambda message: is_admin(message, config.access)).handle])
        self.bus = SessionBus(
            store=self.store, run_turn=timed(self.metrics, self.runner.run), workers=self._workers,
            instance_id=self.instance_id,
            lease_s=config.bus.lease_s, sweep_interval_s=config.bus.sweep_interval_s,
            busy_policy=config.bus.busy_policy,
            on_turn_start=self.typing.start, on_turn_end=self.typing.end,
            album_wait_s=config.media.album_wait_s,
            merges=lambda message: self.chats.busy_policy(message) == "merge", prefetch=self.runner.prefetch,
        )
        self.inbound = Inbound(config=config, store=self.store, directory=self.directory, approvals=self.approvals,
                               runner=self.runner, bus=self.bus, metrics=self.metrics, redact=self.redact,
                               run_db=self.run_db, model_name=lambda: self.agent_spec.model,
                               wake_delivery=self.delivery.wake, group_context=self.group_context,
                               busy_policy=self.chats.busy_policy, prime_settings=self.chats.prime,
                               write_now=self.write_now,
                               submit_db=self.submit_db)
        self._receivers: list[asyncio.Task[None]] = []
        self._housekeeping: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self.http_port: int | None = None
        self.started = False
        """Every adapter has started and no stop has begun: ``/readyz`` is 200 and webhooks are
        accepted only while this is set."""
        self.unfinished_turns = 0
        """Turns still running when a stop's deadline passed (they resume after the restart)."""

    def _model_client(self, target: Target, last: bool) -> ChatModel:
        """The client of one route target. Only a route's last target spends ``llm.max_retries``
        (the SDK's backoff, honouring ``Retry-After``); the others have a fallback to ask at once."""
        llm, provider = self.config.llm, target.provider
        return OpenAIChatModel(
            base_url=provider.base_url, api_key=provider.api_key, model=target.model,
            timeout_s=provider.timeout_s or llm.timeout_s, max_retries=llm.max_retries if last else 0,
            temperature=llm.temperature, stream=llm.stream and "stream" not in target.lacks,
            stream_options="stream_options" not in target.lacks, http_client=llm.http_client,
            missing_key=provider.key_env if provider.key_missing else None)

    def build_system_prompt(self) -> str:
        """A new session's system prompt: the configured one plus the skill catalogue as it is on
        disk now (for the tools chat turns mount). Stored with the session, never rebuilt for it. A
        chat's settings may add a persona and choose the tools and skills (``ChatSetup``)."""
        return self.chats.system_prompt()

    async def run_db(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs a blocking store call off the main loop (on the small DB pool, ``Offload``); returns
        its result or raises its exception."""
        return await self._db_pool.run(fn, *args)

    def submit_db(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Queues a blocking store call for the DB pool and returns its future (``Offload.submit``):
        for a caller that must see the call end even when its own waiter is cancelled."""
        return self._db_pool.submit(fn, *args)

    def write_now(self, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """Runs a store call that makes one short write transaction with planned statements (an
        inbox write, a reply's delivery mark) on the main loop itself when that never waits (SQLite,
        the writer free: ``gateway.store.db.write_now``), saving two thread hops: ``(True, its
        result)``; else ``(False, None)`` with nothing written (the caller uses the DB pool)."""
        return write_now(self.engine, fn, *args)

    def _run_on_loop(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Runs ``coro`` on the main loop from a worker thread and waits at most ``timeout`` s
        (adapter downloads: their clients live on the main loop). Raises ``TimeoutError``."""
        if self._loop is None or self._loop.is_closed():
            coro.close()
            raise TimeoutError("the gateway is not running")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no result within {timeout:g} s") from None

    async def _expire_media(self, older_than_s: float) -> None:
        """Deletes files past ``media.retention_days`` at start and every hour (every instance may:
        a second deletion finds nothing)."""
        while True:
            try:
                gone = await self.run_db(self.media.index.expire, older_than_s)
                if gone.files:
                    log.info("media retention: deleted %d file use(s), %d blob(s)", gone.files, gone.blobs)
            except Exception:
                log.exception("media retention sweep failed; trying again in an hour")
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)

    async def _collect_unreferenced_media(self, older_than_s: float) -> None:
        """Deletes stored files no message uses, ``media.unreferenced_hours`` after they were last
        stored, at start and every hour (``MediaIndex.collect_unreferenced``; every instance may)."""
        while True:
            try:
                removed = await self.run_db(self.media.index.collect_unreferenced, older_than_s)
                if removed:
                    log.info("media: deleted %d stored file(s) no message uses", removed)
            except Exception:
                log.exception("the sweep of unused media failed; trying again in an hour")
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)

    async def _prune_settled(self, older_than_s: float) -> None:
        """Deletes settled bookkeeping rows past ``database.keep_settled_days`` at start and every
        hour (``gateway.store.prune``; every instance may)."""
        while True:
            try:
                pruned = await self.run_db(prune_settled, self.engine, older_than_s)
                if pruned:
                    log.info("database: deleted settled rows older than %g days: %s", older_than_s / 86400,
                             pruned.describe())
            except Exception:
                log.exception("pruning settled rows failed; trying again in an hour")
            await asyncio.sleep(HOUSEKEEPING_INTERVAL_S)

    def _wake_delivery(self) -> None:
        """Thread-safe ``delivery.wake`` (worker threads queue approval prompts and replies)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.delivery.wake)

    def _deliver_now(self, items: list[OutboxItem]) -> None:
        """Thread-safe ``delivery.send_claimed``: a turn's reply, queued claimed, is sent at once
        (when the loop is already closed, the claim expires and the row is claimed again)."""
        if self._loop is None:
            return
        try:
            # A context of its own, as the delivery loop's: the send is not part of the turn's trace
            # (its span would be a child of the turn's, which has ended) nor of its language.
            self._loop.call_soon_threadsafe(self.delivery.send_claimed, items, context=contextvars.Context())
        except RuntimeError:
            log.debug("main loop closed; reply %s sent after its claim expires", [i.id for i in items])

    # -- lifecycle -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Migrates the database (and analyses memory entries stored without ``search_text``), starts
        the bridge, bus, delivery, HTTP server and adapters.

        The HTTP server opens before the adapters start (``/healthz`` answers, ``/readyz`` and
        every webhook get 503) and accepts events once ``started`` is set, after the last
        adapter has started: an event acknowledged earlier could be misjudged (a Feishu group
        mention before the bot's open_id is known would be dropped as not addressed)."""
        await self.run_db(upgrade, self.engine)
        if self.memory is not None:  # entries an older release wrote get their full-text analysis
            await self.run_db(self.memory.memories.analyse_missing)
        await self.instance.acquire()  # InstanceInUse if a live process holds our id; else its leases are ours
        for name, env in self.missing_model_keys.items():
            where = "llm.api_key_env" if name == "default" else f"api_key_env of provider {name}"
            log.warning("%s is not set: model calls to %s go without an API key and fail unless that server "
                        "needs none. Set %s to the key (%s names the variable).",
                        env, self.providers[name].base_url, env, where)
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
        self.conversation.bind(asyncio.get_running_loop())
        self._housekeeping.append(asyncio.create_task(self._expire_group_context()))
        await self.bus.start()
        if self.config.media.retention_days:
            self._housekeeping.append(asyncio.create_task(
                self._expire_media(self.config.media.retention_days * 86400)))
        self._housekeeping.append(asyncio.create_task(
            self._collect_unreferenced_media(self.config.media.unreferenced_hours * 3600)))
        if self.config.database.keep_settled_days:
            self._housekeeping.append(asyncio.create_task(
                self._prune_settled(self.config.database.keep_settled_days * 86400)))
        await self.delivery.start()
        if self.pushes is not None:
            await self.pushes.start()
        if self.serve_http:
            routes = [route for adapter in self.adapters.values() for route in adapter.routes()]
            routes += admin_routes(self)
            app = build_app(routes, self._ready, self._metrics, CONTENT_TYPE, accepting=lambda: self.started,
                            instance=self.instance_id, body_timeout_s=self.config.http.body_timeout_s,
                            body_min_rate=self.config.http.body_min_rate, body_max_s=self.config.http.body_max_s)
            # A connection that has not sent a whole request within idle_timeout_s (from its start, or
            # since its last response) is closed: aiohttp's default, an hour, let a client holding
            # idle sockets use up the process's file descriptors (every endpoint then went dark).
            self._runner = web.AppRunner(app, access_log=None, keepalive_timeout=self.config.http.idle_timeout_s)
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.config.http.host, self.config.http.port,
                               reuse_port=self.config.http.reuse_port or None)
            await site.start()
            self.http_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            log.info("http server on %s:%s", self.config.http.host, self.http_port)
        for adapter in self.adapters.values():
            await adapter.start(self.inbound.receive)
            if getattr(adapter, "receiver_lease", None):
                self._receivers.append(asyncio.create_task(hold_receiver(
                    adapter, store=self.store, instance_id=self.instance_id, lease_s=self.config.bus.lease_s,
                    run_db=self.run_db)))
            else:
                await adapter.start_receiving()
        self.started = True
        self.adapters_ready.set()
        log.info("gateway %s started with %s on the %s event loop", self.instance_id,
                 ", ".join(self.adapters) or "no platforms", running_loop_name())

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
        self.typing.stop()
        for adapter in self.adapters.values():
            try:
                await adapter.stop()
            except Exception:
                log.exception("adapter %s did not stop cleanly", adapter.platform)
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.bus.stop()
        for task in self._housekeeping:
            task.cancel()
        await asyncio.gather(*self._housekeeping, return_exceptions=True)
        finished = not self.unfinished_turns
        # Turns the deadline cut keep their threads; ``gateway run`` exits without waiting for them.
        await loop.run_in_executor(None, functools.partial(self._workers.shutdown, wait=finished,
                                                           cancel_futures=True))
        if self.memory is not None and finished:  # queued write-backs finish first
            await loop.run_in_executor(None, self.memory.close)
        self.bridge.stop()
        await loop.run_in_executor(None, self.media_readers.close)
        await self.instance.release()  # last: nothing of ours holds a lease now
        self._db_pool.shutdown(wait=True)
        close_now_connection(self.engine)
        self.engine.dispose()

    async def _chat_left(self, address: ChatAddress) -> None:
        """The bot is no longer in ``address``'s chat: what was kept of it as group context is
        deleted at once (``ChatLeft``; never raises)."""
        try:
            deleted = await self.run_db(self.group_context.forget_chat, address.platform, address.tenant,
                                        address.chat_id)
        except Exception as exc:  # retention deletes it later anyway
            log.warning("%s: group context of chat %s not deleted (%s)", address.platform, address.chat_id,
                        type(exc).__name__)
            return
        log.info("%s: the bot left chat %s; %d kept group message(s) deleted", address.platform, address.chat_id,
                 deleted)

    async def _expire_group_context(self) -> None:
        """Deletes kept group messages older than ``sessions.group_context_hours``, in every chat,
        every ``GROUP_CONTEXT_SWEEP_S`` (a chat's own are also trimmed whenever it gets one); with
        group context off everywhere, everything kept earlier."""
        sessions = self.config.sessions
        max_age_s = sessions.group_context_hours * 3600 if sessions.most_group_context() > 0 else 0.0
        while True:
            try:
                deleted = await self.run_db(functools.partial(self.group_context.prune, max_age_s=max_age_s))
                if deleted:
                    log.info("group context: %d message(s) older than %s h deleted", deleted,
                             self.config.sessions.group_context_hours)
            except Exception as exc:  # the database is away: next round
                log.warning("group context expiry failed (%s); retrying later", type(exc).__name__)
            await asyncio.sleep(GROUP_CONTEXT_SWEEP_S)

    async def receive(self, message: InboundMessage) -> bool:
        """The adapters' sink (``Inbound.receive``)."""
        return await self.inbound.receive(message)

    @property
    def received(self) -> int:
        """Messages stored in the inbox by this process."""
        return self.inbound.received

    @property
    def duplicates(self) -> int:
        """Messages refused as already stored (platform retries)."""
        return self.inbound.duplicates

    @property
    def dropped(self) -> int:
        """Messages not for the bot (unaddressed, or denied by the access rules)."""
        return self.inbound.dropped

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
            self.metrics.refresh_providers(self.provider_health.snapshot())
        except Exception:
            log.exception("metrics: database gauges not refreshed")
        return self.metrics.render()
