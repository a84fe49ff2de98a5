"""The tool catalogue: every tool this process offers, the toolsets agents mount, MCP servers.

Agents mount subsets of the catalogue (``agent.toolset``); a session's tools are fixed when it is
created, so its tools prefix stays byte-identical for the prompt cache.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from agent.bridge import AsyncBridge
from agent.browser import BrowserTools
from agent.delegate import delegate_tool
from agent.mcp import McpServerSpec
from agent.sandbox import Sandbox, probe
from agent.search import WebSearch
from agent.tools import ToolRegistry
from agent.web import WebFetcher
from agent.workspace import Workspace
from gateway.core.config import GatewayConfig
from gateway.core.errors import ConfigError

log = logging.getLogger("gateway")


def expand_toolset(names: Sequence[str], toolsets: dict[str, list[str]]) -> list[str]:
    """Tool names for ``agent.toolset`` entries: a toolset's name stands for its tools (one level)."""
    out: list[str] = []
    for name in names:
        out.extend(toolsets.get(name, [name]))
    return sorted(set(out))


def build_catalog(config: GatewayConfig, bridge: AsyncBridge) -> ToolRegistry:
    """Every tool this process offers: ``web_fetch``, ``web_search`` when an engine is configured,
    ``delegate``, the workspace tools of the configured rung, and the browser tools when the
    configured Chromium exists. Agents mount
    subsets of it (``agent.toolset``); MCP tools are added once discovered."""
    tools = ToolRegistry()
    for tool in build_workspace(config).tools() if config.tools.workspace != "off" else []:
        tools.add(tool)
    tools.add(WebFetcher(bridge, allow_private=config.tools.web_fetch_allow_private,
                         max_bytes=config.tools.web_fetch_max_bytes).tool())
    search = build_search(config, bridge)
    if search is not None:
        tools.add(search.tool())
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


def build_search(config: GatewayConfig, bridge: AsyncBridge) -> WebSearch | None:
    """The ``web_search`` engine as configured (``search.*``), or ``None`` when none is configured
    or its key is missing (logged: the tool is left out rather than failing every call)."""
    s = config.search
    if not s.configured():
        return None
    key = config.secret(s.api_key_env)
    if s.engine != "searxng" and key is None:
        log.warning("web_search off: search.engine = %s needs its key in %s", s.engine, s.api_key_env)
        return None
    return WebSearch(bridge, engine=s.engine, url=s.url, api_key=key, max_results=s.max_results,
                     language=s.language, timeout_s=s.timeout_s)


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
    """The workspace (and its shell sandbox) as configured; ``tools.workspace`` is its rung.

    Raises:
        ConfigError: ``tools.workspace = "shell"`` and the isolation ``tools.shell_isolation``
            asks for does not work on this host (``best``: neither bubblewrap nor unshare does).
    """
    t = config.tools
    shell = t.workspace == "shell"
    wanted = t.shell_isolation if shell else "none"
    try:
        sandbox = Sandbox(timeout_s=t.shell_timeout_s, max_output_bytes=t.shell_max_output_bytes, cpu_s=t.shell_cpu_s,
                          memory_bytes=t.shell_memory_mb << 20, allow_network=t.shell_allow_network,
                          use_namespaces=shell, max_processes=t.shell_max_processes,
                          isolation=None if wanted == "best" else wanted, tmp_bytes=t.shell_tmp_mb << 20)
    except ValueError as exc:
        raise ConfigError(f'tools.shell_isolation = "{wanted}": {exc}') from None
    if shell and wanted == "best" and sandbox.isolation == "none":
        raise ConfigError(
            'tools.workspace = "shell" needs bubblewrap or unshare to isolate commands, and neither works on this '
            f'host (bubblewrap: {probe("bubblewrap")}; unshare: {probe("namespaces")}). Install bubblewrap and '
            'allow unprivileged user namespaces (in a container: a seccomp profile that permits them), or set '
            'tools.shell_isolation = "none" to run commands with limits only: they would then see the host\'s '
            "files, processes and network, the gateway's own included")
    return Workspace(t.workspace_root, "read" if t.workspace == "off" else t.workspace, sandbox=sandbox,
                     max_disk_bytes=t.workspace_max_mb << 20)
