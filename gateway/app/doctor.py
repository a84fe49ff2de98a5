"""``gateway doctor``: checks config, database, model endpoint and each enabled platform, and says
what is wrong in plain words."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import openai

from agent.redact import Redactor
from gateway.app.startup_errors import describe, url_password
from gateway.core.config import GatewayConfig
from gateway.core.errors import ConfigError


async def run_doctor(config: GatewayConfig) -> int:
    """Prints one line per check (``ok`` / ``FAIL`` / ``warn``); returns 0 when nothing failed
    (warnings do not fail), else 1."""
    failures = 0
    redact = Redactor(config.secret_values() + url_password(config.database.url))

    def report(ok: bool, what: str, detail: str) -> None:
        nonlocal failures
        failures += 0 if ok else 1
        print(f"[{'ok' if ok else 'FAIL'}] {what}: {detail}", flush=True)

    def warn(what: str, detail: str) -> None:
        print(f"[warn] {what}: {detail}", flush=True)

    report(True, "config", "loaded")
    try:
        from gateway.store.db import create_db_engine, upgrade

        engine = create_db_engine(config.database.url)
        await asyncio.to_thread(upgrade, engine)
        engine.dispose()
        report(True, "database", f"{engine.url.render_as_string(hide_password=True)} reachable, migrations applied")
    except Exception as exc:
        report(False, "database", f"cannot use {config.database.url.split('@')[-1]}: {type(exc).__name__}: {exc}")

    await _check_models(config, report)

    try:
        from gateway.app.wiring import build_adapters

        adapters = build_adapters(config)
    except ConfigError as exc:
        report(False, "platforms", str(exc))
        adapters = []
    if not adapters:
        report(True, "platforms", "none enabled")
    for adapter in adapters:
        try:
            detail = await adapter.check()
            report(True, adapter.platform, detail)
        except Exception as exc:  # one line, the setting at fault named, as `gateway run` says it
            report(False, adapter.platform, describe(exc, config, redact, f"{adapter.platform} check"))
    await _check_tools(config, report, warn)
    _check_access(config, report, warn)
    _check_skills(config, report)
    print("all checks passed" if failures == 0 else f"{failures} check(s) failed", flush=True)
    return 0 if failures == 0 else 1


async def _check_models(config: GatewayConfig, report: Callable[[bool, str, str], None]) -> None:
    """Each route, and each provider a route uses: its key is set, it answers ``GET /models`` with
    that key (a refused key is what marks a provider down in a running gateway) and lists the
    routed models (a server without a model list is fine)."""
    llm = config.llm
    providers = llm.build_providers(config.secret)
    for name in llm.route_names():
        report(True, f"route {name}", " → ".join(t.name for t in llm.targets(providers, name)))
    routed: dict[str, list[str]] = {}
    for name in llm.route_names():
        for target in llm.targets(providers, name):
            routed.setdefault(target.provider.name, []).append(target.model)
    for name, models in routed.items():
        provider = providers[name]
        what, url = f"model provider {name}", provider.base_url
        if provider.key_missing:
            report(False, what, f"environment variable {provider.key_env} is not set")
            continue
        try:
            listed = await asyncio.to_thread(_listed_models, url, provider.api_key)
        except openai.AuthenticationError as exc:
            report(False, what, f"{url} rejected the API key in {provider.key_env} ({exc.status_code}): the "
                                "provider is down, routes use their next model")
        except openai.PermissionDeniedError as exc:
            report(False, what, f"{url} refused the API key in {provider.key_env} ({exc.status_code}): the "
                                "provider is down, routes use their next model")
        except openai.NotFoundError:
            report(True, what, f"{url} reachable (it lists no models); routed: {', '.join(models)}")
        except openai.APIConnectionError:
            report(False, what, f"cannot reach {url}")
        except openai.APIStatusError as exc:
            report(False, what, f"{url} answered {exc.status_code}")
        else:
            found = "; ".join(f"model {m} {'listed' if m in listed else 'not in its model list'}" for m in models)
            report(True, what, f"{url} reachable; {found}")


def _listed_models(base_url: str, api_key: str) -> set[str]:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=10, max_retries=0)
    return {m.id for m in client.models.list()}


def guarded_tools(config: GatewayConfig) -> tuple[list[str], list[str]]:
    """The chat tools with side effects (``write``/``external``) this config mounts, split into
    ``(need approval, run without approval)`` by ``[approvals]``. MCP servers appear as
    ``mcp NAME`` (their tools are ``external`` unless marked read-only)."""
    from agent.bridge import AsyncBridge
    from gateway.tools.catalog import build_catalog, expand_toolset

    # Built, never started; only names and side effects are read, so the shell sandbox is not
    # probed (its own check reports whether it works).
    listing = config.model_copy(update={"tools": config.tools.model_copy(update={"shell_isolation": "none"})})
    tools = build_catalog(listing, AsyncBridge("doctor-catalog")).tools
    mounted = set(expand_toolset(config.agent.toolset, config.tools.toolsets)) \
        if config.agent.toolset is not None else None
    effects = {name: tool.side_effect for name, tool in tools.items()}
    if config.scheduler.enabled:
        effects["schedule_report"] = "write"
    for name, server in config.mcp.servers.items():
        if server.enabled:
            effects[f"mcp {name}"] = "external"
    require = set(config.approvals.require_for)
    guarded: list[str] = []
    free: list[str] = []
    for name, effect in sorted(effects.items()):
        if effect not in ("write", "external") or (mounted is not None and name not in mounted
                                                   and not name.startswith("mcp ")):
            continue
        (guarded if effect in require else free).append(name)
    if "run_shell" in free and config.approvals.dangerous_shell_patterns:
        free[free.index("run_shell")] = "run_shell (dangerous commands still need approval)"
    return guarded, free


def _check_access(config: GatewayConfig, report: Callable[[bool, str, str], None],
                  warn: Callable[[str, str], None]) -> None:
    """Open access with tools that act on the world: who can run them (``gateway.inbound.access``)."""
    from gateway.inbound.access import admin_pages_on

    access = config.access
    if access.mode != "open":
        report(True, "access", f"allowlist ({len(access.allowed_users)} users, {len(access.allowed_chats)} chats, "
                               f"{len(access.admins)} admins)")
        return
    guarded, free = guarded_tools(config)
    if not guarded and not free:
        warn("access", 'mode = "open": anyone who finds the bot can talk to it (no tool acts on the world); '
                       'production: access.mode = "allowlist"')
        return
    deciders = "; ".join(filter(None, [f"access.admins ({len(access.admins)})" if access.admins else "",
                                       "the admin pages" if admin_pages_on(config) else ""]))
    if guarded:
        who = f"an admin must approve them ({deciders})" if deciders else \
            "they are refused, since no admin is configured (access.admins, or the admin pages)"
        warn("access", f'mode = "open" with {", ".join(guarded)}: when a stranger asks, {who}; '
                       'production: access.mode = "allowlist" (README: Production checklist)')
    if free:
        warn("approvals", f'mode = "open" and approvals.require_for does not cover {", ".join(free)}: '
                          "ANYONE who finds the bot can run them without asking; add \"write\" and "
                          '"external" to approvals.require_for or use access.mode = "allowlist"')


def _check_skills(config: GatewayConfig, report: Callable[[bool, str, str], None]) -> None:
    """How many skills are installed and which ones ``gateway skills validate`` would reject."""
    if not config.skills.enabled:
        report(True, "skills", "off")
        return
    from agent.skills import SkillLibrary, problems

    folders = SkillLibrary(config.skills.dirs()).folders()
    bad = sorted(name for name, folder in folders.items() if problems(folder))
    where = config.skills.directory + (" and bundled" if config.skills.bundled else "")
    detail = f"{len(folders) - len(bad)} valid ({where})"
    if bad:
        detail += f"; invalid: {', '.join(bad)} (see `gateway skills validate`)"
    report(not bad, "skills", detail)


async def _check_search(config: GatewayConfig, bridge: Any, report: Callable[[bool, str, str], None]) -> None:
    """``web_search``: off, or the engine answers a test query."""
    from agent.search import SearchError
    from gateway.tools.catalog import build_search

    if not config.search.configured():
        return
    search = build_search(config, bridge)
    if search is None:
        report(False, "web search", f"{config.search.engine} needs its key in {config.search.api_key_env}")
        return
    try:
        text = await asyncio.to_thread(bridge.run, search.search("agent gateway"), config.search.timeout_s + 5)
    except (SearchError, TimeoutError) as exc:
        report(False, "web search", f"{config.search.engine}: {exc}")
        return
    report(True, "web search", f"{config.search.engine} answers ({text.count(chr(10) + '   http')} results)")


async def _check_tools(config: GatewayConfig, report: Callable[[bool, str, str], None],
                       warn: Callable[[str, str], None]) -> None:
    """The workspace rung and shell sandbox in effect, and each MCP server's tools (or why not)."""
    from agent.bridge import AsyncBridge
    from agent.mcp import McpClients
    from gateway.tools.catalog import build_workspace, mcp_specs

    if config.tools.workspace == "off":
        report(True, "workspace", "off (no file or shell tools)")
    else:
        try:
            workspace = await asyncio.to_thread(build_workspace, config)
        except ConfigError as exc:  # shell without the isolation asked for: `gateway run` refuses too
            report(False, "shell isolation", str(exc))
            workspace = None
        if workspace is not None:
            detail = f"{config.tools.workspace} in {workspace.root}"
            if config.tools.workspace == "shell":
                detail += (f" (at most {workspace.max_disk_bytes >> 20} MB each); "
                           f"shell sandbox {workspace.sandbox.describe()}")
            report(True, "workspace", detail)
        if workspace is not None and config.tools.workspace == "shell":  # bubblewrap / namespaces / none
            isolation = workspace.sandbox.isolation
            if isolation == "bubblewrap":
                report(True, "shell isolation", workspace.sandbox.describe_isolation())
            else:  # chosen by the operator (tools.shell_isolation), or the fallback of "best"
                warn("shell isolation", workspace.sandbox.describe_isolation())
    specs = mcp_specs(config)
    if not specs and not config.search.configured():
        return
    bridge = AsyncBridge("doctor-bridge")
    bridge.start()
    try:
        await _check_search(config, bridge, report)
        clients = McpClients(specs, bridge)
        await clients.discover(config.mcp.startup_timeout_s)
        for status in sorted(clients.status, key=lambda s: s.name):
            detail = f"{status.detail} ({', '.join(status.tools)})" if status.ok and status.tools else status.detail
            report(status.ok, f"mcp {status.name}", detail)
    finally:
        await asyncio.to_thread(bridge.stop)
