"""Prometheus metrics (``/metrics``): one ``CollectorRegistry`` per ``Gateway``.

Never the client's global registry: tests (and ``bench``) run several gateways in one process.
Counters and histograms are updated where things happen (receive, turn, model call, delivery);
the database-backed gauges (pending inbox, active leases, unconfirmed deliveries) are read once
per scrape by ``refresh`` and held in plain gauges.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agent.budget import Limits
from agent.model import ChatModel, ModelReply, OnText, Usage
from gateway.core.providers import DEFAULT_PROVIDER

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TURN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
_MODEL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)


class GatewayMetrics:
    """The gateway's metric families, registered on their own registry."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.inbound = Counter("gateway_inbound_messages", "Inbound messages stored for a turn", ["platform"],
                               registry=r)
        self.duplicates = Counter("gateway_inbound_duplicates", "Redelivered inbound messages dropped",
                                  ["platform"], registry=r)
        self.dropped = Counter("gateway_inbound_dropped", "Inbound messages ignored (not addressed, not allowed)",
                               ["platform"], registry=r)
        self.turns = Counter("gateway_turns", "Finished turns", ["outcome", "stop_reason"], registry=r)
        self.turn_seconds = Histogram("gateway_turn_duration_seconds", "Turn wall time (load to reply queued)",
                                      buckets=_TURN_BUCKETS, registry=r)
        self.model_seconds = Histogram("gateway_model_call_duration_seconds", "Model call wall time",
                                       ["model", "outcome"], buckets=_MODEL_BUCKETS, registry=r)
        self.tokens = Counter("gateway_model_tokens", "Model tokens by kind (input, output, cached_input)",
                              ["model", "kind"], registry=r)
        self.cost = Counter("gateway_model_cost_usd", "Model cost in USD from the price table", ["model"],
                            registry=r)
        self.tool_calls = Counter("gateway_tool_calls", "Tool calls answered", ["tool", "outcome"], registry=r)
        self.delivery_sends = Counter("gateway_delivery_sends", "Replies delivered", ["platform"], registry=r)
        self.delivery_retries = Counter("gateway_delivery_retries", "Delivery attempts that will be retried",
                                        ["platform"], registry=r)
        self.delivery_failures = Counter("gateway_delivery_failures", "Replies that failed permanently",
                                         ["platform"], registry=r)
        self.inbox_pending = Gauge("gateway_inbox_pending", "Inbound messages waiting for their turn (all lanes)",
                                   registry=r)
        self.active_leases = Gauge("gateway_active_leases", "Lane leases currently held (all instances)",
                                   registry=r)
        self.unconfirmed = Gauge("gateway_deliveries_unconfirmed",
                                 "Replies whose part in flight at a crash was not resent", registry=r)
        self.turns_running = Gauge("gateway_turns_running", "Turns running on this instance", registry=r)
        self.scheduled_fires = Counter("gateway_scheduled_fires", "Scheduled report runs by outcome "
                                       "(delivering, failed, skipped, lost)", ["status"], registry=r)
        labels = ["provider", "model"]
        self.provider_requests = Counter("gateway_provider_requests", "Model requests sent, by provider and model",
                                         labels, registry=r)
        self.provider_failures = Counter("gateway_provider_failures", "Failed model requests by reason (rate_limited, "
                                         "server, timeout, connection, stream, auth, not_found, context_length, "
                                         "invalid_tools, request)", [*labels, "reason"], registry=r)
        self.provider_failovers = Counter("gateway_provider_failovers", "Model calls a route passed on from this "
                                          "provider and model to its next one, by reason (a failure reason, or "
                                          "cooldown, open, down, probing when it was skipped)", [*labels, "reason"],
                                          registry=r)
        self.provider_tokens = Counter("gateway_provider_tokens", "Tokens of the answers of each provider and model "
                                       "(input, output, cached_input)", [*labels, "kind"], registry=r)
        self.provider_cost = Counter("gateway_provider_cost_usd", "Cost in USD of the answers of each provider and "
                                     "model, at the configured price (cache discount included)", labels, registry=r)
        self.provider_available = Gauge("gateway_provider_available", "1 while calls may go to the provider (ok, "
                                        "half-open), 0 while it cools down after a 429, its circuit is open or it is "
                                        "down (401/403)", ["provider"], registry=r)
        self.routes = ProviderCounters(self)
        """The ``agent.routing.RouteEvents`` that count into the provider metrics."""

    def refresh(self, pending: int, leases: int, outbox: dict[str, int]) -> None:
        """Sets the database-backed gauges (called before each scrape)."""
        self.inbox_pending.set(pending)
        self.active_leases.set(leases)
        self.unconfirmed.set(outbox.get("unconfirmed", 0))

    def refresh_providers(self, health: list[dict[str, Any]]) -> None:
        """Sets ``gateway_provider_available`` from ``HealthBoard.snapshot()`` (before each scrape)."""
        for entry in health:
            self.provider_available.labels(entry["provider"]).set(1 if entry["state"] in ("ok", "half_open") else 0)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)

    def observe_usage(self, model: str, usage: Usage, cost: float) -> None:
        """Counts one model call's tokens and cost."""
        self.tokens.labels(model, "input").inc(usage.prompt_tokens)
        self.tokens.labels(model, "output").inc(usage.completion_tokens)
        self.tokens.labels(model, "cached_input").inc(usage.cached_tokens)
        self.cost.labels(model).inc(cost)


class ProviderCounters:
    """``agent.routing.RouteEvents`` counted into ``GatewayMetrics``' ``gateway_provider_*`` families."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def requested(self, provider: str, model: str) -> None:
        self._m.provider_requests.labels(provider, model).inc()

    def failed(self, provider: str, model: str, reason: str) -> None:
        self._m.provider_failures.labels(provider, model, reason).inc()

    def failed_over(self, provider: str, model: str, reason: str) -> None:
        self._m.provider_failovers.labels(provider, model, reason).inc()

    def answered(self, provider: str, model: str, usage: Usage) -> None:
        tokens = self._m.provider_tokens
        tokens.labels(provider, model, "input").inc(usage.prompt_tokens)
        tokens.labels(provider, model, "output").inc(usage.completion_tokens)
        tokens.labels(provider, model, "cached_input").inc(usage.cached_tokens)


class MeteredModel:
    """A ``ChatModel`` that times each call and counts its tokens and cost (sub-agents' calls too),
    under the model that answered (a route's fallback counts as itself).

    Args:
        inner: the model client (or a route).
        metrics: where to count.
        limits: the price table (a model without a price costs 0).
    """

    def __init__(self, inner: ChatModel, metrics: GatewayMetrics, limits: Limits) -> None:
        self.inner = inner
        self.model = inner.model
        self._metrics = metrics
        self._limits = limits

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_text: OnText | None = None) -> ModelReply:
        """Calls the inner model, recording latency (``ok``/``error``), tokens and cost."""
        started = time.monotonic()
        try:
            reply = self.inner.complete(messages, tools, on_text)
        except BaseException:
            self._metrics.model_seconds.labels(self.model, "error").observe(time.monotonic() - started)
            raise
        answered = reply.model or self.model
        self._metrics.model_seconds.labels(answered, "ok").observe(time.monotonic() - started)
        price = self._limits.price_of(answered, reply.provider)
        cost = price.cost(reply.usage) if price is not None else 0.0
        self._metrics.observe_usage(answered, reply.usage, cost)
        self._metrics.provider_cost.labels(reply.provider or DEFAULT_PROVIDER, answered).inc(cost)
        return reply

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def timed(metrics: GatewayMetrics, fn: Callable[..., str]) -> Callable[..., str]:
    """Wraps a turn function: counts running turns and observes each turn's duration."""

    def run(*args: Any) -> str:
        metrics.turns_running.inc()
        started = time.monotonic()
        try:
            return fn(*args)
        finally:
            metrics.turn_seconds.observe(time.monotonic() - started)
            metrics.turns_running.dec()

    return run
