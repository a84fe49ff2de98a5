"""Configuration of model providers and routes (``[[llm.providers]]``, ``llm.route``, ``[llm.routes.NAME]``).

```toml
[[llm.providers]]
name = "openai"
base_url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"
models = { "gpt-4o-mini" = { context_window_tokens = 128000, input = 0.15, cached_input = 0.075, output = 0.60 } }

[[llm.providers]]
name = "local"
base_url = "http://127.0.0.1:11434/v1"        # Ollama; no key
lacks = ["parallel_tool_calls", "vision"]
max_concurrency = 2
models = { "qwen2.5:7b" = { context_window_tokens = 32768 } }

[llm]
route = ["openai:gpt-4o-mini", "local:qwen2.5:7b"]    # primary, then fallbacks

[llm.routes.local-first]
models = ["local:qwen2.5:7b", "openai:gpt-4o-mini"]
```

The single ``llm.base_url`` / ``llm.api_key_env`` / ``llm.model`` of earlier versions is the
provider named ``default`` (declaring a provider of that name replaces it); it accepts any model
name. Without ``llm.route`` the route is ``default:<llm.model>``, so a config without providers
works as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agent.budget import Price
from agent.providers import Capability, ModelInfo, Provider, Target, split_target

DEFAULT_PROVIDER = "default"
"""The provider made of ``llm.base_url``, ``llm.api_key_env`` and ``llm.model``."""
DEFAULT_ROUTE = "default"
"""The name of the route ``llm.route`` defines (chat turns, scheduled reports, memory, summaries)."""
NO_KEY = "not-needed"
"""Sent as the key to a provider without ``api_key_env`` (the client needs some value)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProviderModelConfig(_Section):
    """One model of a provider. Prices are USD per 1M tokens (all unset: ``agent.prices`` by model
    name applies, then 0)."""

    context_window_tokens: int | None = Field(default=None, ge=256)
    """Prompt + reply tokens; unset: ``llm.context_window_tokens``."""
    input: float | None = Field(default=None, ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    output: float | None = Field(default=None, ge=0)
    lacks: list[Capability] = Field(default_factory=list)
    """Capabilities this model lacks beyond its provider's (``["vision"]`` for a text-only model)."""

    @model_validator(mode="after")
    def _prices_together(self) -> ProviderModelConfig:
        if (self.input is None) != (self.output is None) or (self.cached_input is not None and self.input is None):
            raise ValueError("give input and output prices together (cached_input optional)")
        return self

    def price(self) -> Price | None:
        return None if self.input is None or self.output is None else Price(self.input, self.output, self.cached_input)


class ProviderConfig(_Section):
    """One OpenAI-compatible endpoint (``[[llm.providers]]``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    """Used in routes (``name:model``), metrics, traces, the transcript and logs."""
    base_url: str = Field(min_length=1)
    api_key_env: str | None = None
    """Environment variable holding its key; unset: the server needs none (a local one)."""
    models: dict[str, ProviderModelConfig] = Field(min_length=1)
    """The models routes may name, with their context windows and prices."""
    lacks: list[Capability] = Field(default_factory=list)
    """What the server lacks: ``stream``, ``stream_options``, ``parallel_tool_calls``, ``vision``
    (README "Providers and routes": what the gateway does instead)."""
    max_concurrency: int | None = Field(default=None, ge=1)
    """Most calls in flight to it at once (``None``: no limit); further calls wait."""
    timeout_s: float | None = Field(default=None, gt=0)
    """Per call; unset: ``llm.timeout_s``."""


class RouteConfig(_Section):
    """A named route (``[llm.routes.NAME]``): a primary model and its fallbacks."""

    models: list[str] = Field(min_length=1)
    """``provider:model`` entries, primary first."""
    description: str = ""
    """Shown where routes are listed."""


class RoutesMixin(_Section):
    """The provider and route keys of ``[llm]`` (``LlmConfig`` inherits them, unknown keys are
    errors) and their resolution."""

    providers: list[ProviderConfig] = Field(default_factory=list)
    route: list[str] | None = Field(default=None, min_length=1)
    """The default route: ``provider:model`` entries, primary first; unset: ``default:<llm.model>``."""
    routes: dict[str, RouteConfig] = Field(default_factory=dict)
    """Named routes beside the default one."""
    breaker_failures: int = Field(default=3, ge=1)
    """Failures in a row (5xx, timeout, connection, broken stream) that open a provider's circuit."""
    breaker_open_s: float = Field(default=30.0, gt=0)
    """How long an open circuit skips the provider before one probe call."""
    rate_limit_cooldown_s: float = Field(default=30.0, ge=0)
    """How long a provider is skipped after a 429 without ``Retry-After``."""
    auth_recheck_s: float = Field(default=600.0, gt=0)
    """How long a provider that refused its key (401/403) is skipped before one probe call."""

    @model_validator(mode="after")
    def _check_routes(self) -> RoutesMixin:
        names = [p.name for p in self.providers]
        if len(set(names)) != len(names):
            raise ValueError(f"llm.providers: names must be unique (got {', '.join(names)})")
        if DEFAULT_ROUTE in self.routes:
            raise ValueError(f"llm.routes.{DEFAULT_ROUTE}: that name is llm.route's; give the route another name")
        for name in self.route_names():
            self.route_entries(name)  # ValueError naming the bad entry
        return self

    # -- resolution (the fields of ``LlmConfig`` it reads: base_url, api_key_env, model, context_window_tokens)
    def provider_configs(self) -> dict[str, ProviderConfig]:
        """Every provider by name, the implicit ``default`` one included (its ``models`` is empty: any)."""
        legacy: Any = self
        table = {DEFAULT_PROVIDER: ProviderConfig.model_construct(
            name=DEFAULT_PROVIDER, base_url=legacy.base_url, api_key_env=legacy.api_key_env, models={}, lacks=[],
            max_concurrency=None, timeout_s=None)}
        table.update({p.name: p for p in self.providers})
        return table

    def route_names(self) -> list[str]:
        """``default`` first, then the named routes."""
        return [DEFAULT_ROUTE, *self.routes]

    def route_entries(self, name: str = DEFAULT_ROUTE) -> list[tuple[str, str]]:
        """The route's ``(provider, model)`` pairs, primary first.

        Raises:
            KeyError: no route of that name.
            ValueError: an entry names an unknown provider or a model its provider does not list.
        """
        legacy: Any = self
        if name == DEFAULT_ROUTE:
            entries, where = self.route or [f"{DEFAULT_PROVIDER}:{legacy.model}"], "llm.route"
        else:
            entries, where = self.routes[name].models, f"llm.routes.{name}.models"
        providers = self.provider_configs()
        out = []
        for entry in entries:
            try:
                provider, model = split_target(entry)
            except ValueError:
                raise ValueError(f"{where}: {entry!r} is not provider:model (e.g. openai:gpt-4o-mini)") from None
            if provider not in providers:
                raise ValueError(f"{where}: {entry!r} names no provider in llm.providers "
                                 f"(known: {', '.join(sorted(providers))})")
            models = providers[provider].models
            if models and model not in models:
                raise ValueError(f"{where}: provider {provider!r} lists no model {model!r} "
                                 f"(its models: {', '.join(models)})")
            out.append((provider, model))
        if len(set(out)) != len(out):
            raise ValueError(f"{where}: a model appears twice")
        return out

    def routed_providers(self) -> list[str]:
        """Names of the providers some route uses (the ones doctor and the start-up checks look at)."""
        seen: dict[str, None] = {}
        for name in self.route_names():
            for provider, _ in self.route_entries(name):
                seen.setdefault(provider)
        return list(seen)

    def build_providers(self, secret: Callable[[str], str | None]) -> dict[str, Provider]:
        """Every configured provider with its key read through ``secret`` (missing keys flagged)."""
        legacy: Any = self
        out = {}
        for name, config in self.provider_configs().items():
            key = secret(config.api_key_env) if config.api_key_env else NO_KEY
            models = {model: ModelInfo(m.context_window_tokens or legacy.context_window_tokens, m.price(),
                                       frozenset(m.lacks)) for model, m in config.models.items()}
            out[name] = Provider(name=name, base_url=config.base_url, api_key=key or "missing-api-key",
                                 key_env=config.api_key_env, key_missing=key is None, models=models,
                                 lacks=frozenset(config.lacks), max_concurrency=config.max_concurrency,
                                 timeout_s=config.timeout_s, context_window_tokens=legacy.context_window_tokens)
        return out

    def targets(self, providers: Mapping[str, Provider], name: str = DEFAULT_ROUTE) -> list[Target]:
        """The route ``name`` as targets over ``providers`` (from ``build_providers``)."""
        return [Target(providers[provider], model) for provider, model in self.route_entries(name)]

    def provider_prices(self) -> dict[str, Price]:
        """``provider:model`` -> price, for the models whose provider gives one."""
        return {f"{p.name}:{model}": price for p in self.providers for model, m in p.models.items()
                if (price := m.price()) is not None}

    def route_window(self, name: str = DEFAULT_ROUTE) -> int:
        """The context window the route's turns are fitted to: its primary model's (or
        ``llm.context_window_tokens``). A fallback with a smaller window that refuses a request as too
        long gets it compressed for its own window and retried once (``FitOnOverflow``)."""
        legacy: Any = self
        provider, model = self.route_entries(name)[0]
        config = self.provider_configs()[provider].models.get(model)
        return (config.context_window_tokens if config is not None else None) or legacy.context_window_tokens
