"""Agent cache (DESIGN §6): agent instances reused across turns, rebuilt when their signature changes.

An ``Agent`` is only configuration and clients: the model client (HTTP connection pool) and the
mounted tool registry with its rendered schemas. Nothing about a session lives in it, so any
instance (in any process) can serve any turn.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.model import ChatModel
from agent.tools import ToolRegistry


@dataclass(frozen=True)
class AgentSpec:
    """What an agent is built from. ``api_key`` never appears in ``repr`` or in the signature."""

    model: str
    base_url: str
    api_key: str = field(repr=False)
    toolset: tuple[str, ...]
    """Names of the mounted tools (order irrelevant)."""
    route: tuple[str, ...] = ()
    """The route's ``provider:model`` entries, primary first (``agent.routing``); ``model``,
    ``base_url`` and ``api_key`` are then its primary's. Empty: no route (one endpoint)."""

    def signature(self) -> str:
        """sha256 over model, endpoint, the key's hash, the sorted toolset and the route."""
        key_hash = hashlib.sha256(self.api_key.encode()).hexdigest()
        raw = "\n".join([self.model, self.base_url.rstrip("/"), key_hash, ",".join(sorted(set(self.toolset))),
                         ">".join(self.route)])
        return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class Agent:
    """A model client with its mounted tools."""

    model: ChatModel
    tools: ToolRegistry
    signature: str


class AgentCache:
    """Thread-safe LRU of ``Agent`` by ``AgentSpec.signature()``.

    Args:
        catalog: every tool the process offers; an agent mounts ``catalog.subset(spec.toolset)``.
        build_model: makes the model client for a spec (called once per signature).
        max_size: agents kept; the least recently used is dropped beyond it.
    """

    def __init__(self, catalog: ToolRegistry, build_model: Callable[[AgentSpec], ChatModel],
                 max_size: int = 32) -> None:
        self.catalog = catalog
        self._build_model = build_model
        self._max_size = max_size
        self._agents: OrderedDict[str, Agent] = OrderedDict()
        self._lock = threading.Lock()
        self.builds = 0

    def get(self, spec: AgentSpec) -> Agent:
        """The cached agent for ``spec``, built on first use or after the signature changed."""
        signature = spec.signature()
        with self._lock:
            agent = self._agents.get(signature)
            if agent is None:
                agent = Agent(self._build_model(spec), self.catalog.subset(spec.toolset), signature)
                self.builds += 1
                self._agents[signature] = agent
                while len(self._agents) > self._max_size:
                    self._agents.popitem(last=False)
            self._agents.move_to_end(signature)
            return agent
