"""Builds long-term memory from the configuration (``[memory]``)."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine

from agent.model import ChatModel
from gateway.core.config import GatewayConfig
from gateway.memory.embed import Embedder
from gateway.memory.recall import Recaller, RecallPolicy
from gateway.memory.service import MemoryService
from gateway.memory.store import MemoryStore
from gateway.sessions.directory import Directory
from gateway.store.sql import Store


def build_memory(config: GatewayConfig, engine: Engine, store: Store, model: Callable[[], ChatModel]) -> MemoryService:
    """The memory service for ``config.memory`` on ``engine`` (``model``: returns the chat model).

    Raises:
        gateway.core.errors.ConfigError: an embeddings endpoint is configured but its key variable is unset.
    """
    mc = config.memory
    policy = RecallPolicy(budget_tokens=mc.budget_tokens, threshold=mc.threshold, relative=mc.relative,
                          max_entries=mc.max_entries, half_life_days=mc.half_life_days, vector_floor=mc.vector_floor)
    embed = None
    if mc.embeddings_url:
        embed = Embedder(base_url=mc.embeddings_url, model=mc.embeddings_model,
                         api_key=config.require_secret(mc.embeddings_key_env, "memory.embeddings_url"))
    memories = MemoryStore(engine)
    return MemoryService(memories=memories, store=store, directory=Directory(engine),
                         recaller=Recaller(memories, policy, embed), model=model,
                         group_scope=config.sessions.group_scope, promote=mc.promote,
                         promote_min_chars=mc.promote_min_chars, rewrite_query=mc.rewrite_query, embed=embed)
