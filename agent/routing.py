"""Routes: a primary model and its fallbacks, each at some provider, with failover rules and a
circuit breaker per provider.

``RoutedModel.complete`` asks the route's targets in order and returns the first answer:

- a provider's fault (``agent.model_errors.FAILOVER_REASONS``: 429, 5xx, timeouts, connection
  errors, a stream that broke off, 401/403, 404) moves on to the next target at once;
- a fault of the request (400/422: context too long, an invalid tool schema, anything else) is
  raised at once: another provider would refuse the same request, and an answer from a worse
  model is no fix. (The turn compresses and retries a too-long request once:
  ``gateway.bus.compression.FitOnOverflow``.)

``ProviderHealth`` (one per provider, shared by every route through ``HealthBoard``) decides
whether a provider is asked at all:

- ``ok``: calls go.
- ``cooldown`` (after a 429): skipped for its ``Retry-After`` (``rate_limit_cooldown_s`` without
  one), then ``ok``.
- ``open`` (``failures_to_open`` failures in a row: 5xx, timeout, connection, a broken stream,
  404; or a failed probe): skipped for ``open_s``, then ``half_open``.
- ``down`` (401/403, logged once at ERROR): skipped for ``auth_recheck_s``, then ``half_open``.
- ``half_open``: one call at a time goes as the probe (the others skip the provider); success
  closes the circuit, a failure opens it (or marks it down) again.

A call whose every target is skipped fails at once (reason ``unavailable``) saying when to try
again: no request is made to a provider that asked us to wait. A 400 is an answer: it proves the
provider up (a probe that gets one closes the circuit).

Which target answered is on the reply (``ModelReply.provider``, ``.model``) and each failover is
an event on the current span (``agent.tracing.failover_event``). Thread-safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.model import ChatModel, ModelError, ModelReply, OnText, Usage
from agent.providers import Provider, Target, adapt_messages
from agent.tokens import json_tokens, request_tokens, text_tokens
from agent.tracing import failover_event

log = logging.getLogger("agent.routing")

BREAKER_REASONS = frozenset({"server", "timeout", "connection", "stream", "not_found"})
"""Failures that count towards opening a provider's circuit."""


@dataclass(frozen=True)
class HealthSettings:
    """When a provider is skipped. Seconds are of ``time.monotonic``."""

    failures_to_open: int = 3
    """Consecutive breaker failures (``BREAKER_REASONS``) that open the circuit."""
    open_s: float = 30.0
    """How long an open circuit skips the provider before a probe."""
    rate_limit_cooldown_s: float = 30.0
    """Cooldown after a 429 without ``Retry-After``."""
    auth_recheck_s: float = 600.0
    """How long a provider that refused the key (401/403) stays down before a probe."""


class ProviderHealth:
    """The circuit breaker and cooldown of one provider (module doc).

    Args:
        name: the provider's name (logs).
        settings: thresholds and waits.
        clock: monotonic seconds (tests pass their own).
        key_env: the variable holding the provider's key (named in the "down" log line).
    """

    def __init__(self, name: str, settings: HealthSettings, clock: Callable[[], float] = time.monotonic,
                 key_env: str | None = None) -> None:
        self.name = name
        self.settings = settings
        self.key_env = key_env
        self._clock = clock
        self._lock = threading.Lock()
        self._state = "ok"
        self._until = 0.0
        self._failures = 0
        self._probing = False
        self._why = ""
        self._since = time.time()

    def admit(self) -> str | None:
        """``None`` when a call may go to the provider now (in ``half_open`` it becomes the probe:
        report its end with ``succeeded``/``failed``/``released``), else why it is skipped:
        ``cooldown``, ``open``, ``down`` or ``probing`` (another call is the probe)."""
        with self._lock:
            if self._state == "ok":
                return None
            now = self._clock()
            if self._state == "cooldown":
                if now >= self._until:
                    self._set("ok", "")
                    return None
                return "cooldown"
            if now < self._until:
                return self._state
            if self._probing:
                return "probing"
            self._probing = True
            return None

    def retry_in(self) -> float:
        """Seconds until a call may go again (0: now)."""
        with self._lock:
            if self._state == "ok":
                return 0.0
            return max(0.0, self._until - self._clock())

    def succeeded(self) -> None:
        """The provider answered (a 4xx about the request counts: it is up)."""
        with self._lock:
            recovered = self._state in ("open", "down")
            self._probing = False
            self._failures = 0
            if self._state != "ok":
                self._set("ok", "")
        if recovered:
            log.info("model provider %s answers again", self.name)

    def released(self) -> None:
        """The call ended without an answer or a provider error (the turn was cancelled, a bug)."""
        with self._lock:
            self._probing = False

    def failed(self, reason: str, retry_after: float | None = None, detail: str = "") -> None:
        """Records a failed call. ``reason`` is ``ModelError.reason``; ``detail`` a short plain
        description (no secrets) for logs and the Health page."""
        settings = self.settings
        with self._lock:
            now = self._clock()
            probe, self._probing = self._probing, False
            was = self._state
            if reason == "rate_limited":
                wait = settings.rate_limit_cooldown_s if retry_after is None else retry_after
                self._set("cooldown", f"rate limited (429), cooling down {wait:.0f} s")
                self._until = now + wait
            elif reason == "auth":
                self._set("down", detail or "rejected the API key")
                self._until = now + settings.auth_recheck_s
            elif reason in BREAKER_REASONS:
                self._failures += 1
                if probe or self._failures >= settings.failures_to_open or was == "open":
                    self._set("open", f"{self._failures} failure(s) in a row, last: {detail or reason}")
                    self._until = now + settings.open_s
            else:  # the provider answered; the request was at fault
                self._failures = 0
                if probe or was == "cooldown":
                    self._set("ok", "")
            state = self._state
        if state == "down" and was != "down":
            log.error("model provider %s is down: %s%s; routes go on with their next model, and it is asked "
                      "again in %.0f s (check the key; `gateway doctor` checks it)", self.name,
                      detail or "it rejected the API key", f" ({self.key_env})" if self.key_env else "",
                      settings.auth_recheck_s)
        elif state == "open" and was != "open":
            log.warning("model provider %s: circuit open for %.0f s after %s; routes go on with their next model",
                        self.name, settings.open_s, self._why)
        elif state == "cooldown" and was != "cooldown":
            log.info("model provider %s is rate limited: skipped for %.0f s", self.name, self.retry_in())

    def _set(self, state: str, why: str) -> None:
        if state != self._state:
            self._since = time.time()
        self._state, self._why = state, why

    def snapshot(self) -> dict[str, Any]:
        """``{"provider", "state", "why", "retry_in_s", "since", "failures"}``: ``state`` is ``ok``,
        ``cooldown``, ``open``, ``down`` or ``half_open`` (the next call probes); ``since`` is wall time."""
        with self._lock:
            now = self._clock()
            state = self._state
            if state in ("open", "down") and now >= self._until:
                state = "half_open"
            elif state == "cooldown" and now >= self._until:
                state = "ok"
            return {"provider": self.name, "state": state, "why": self._why if state != "ok" else "",
                    "retry_in_s": max(0.0, self._until - now) if state in ("cooldown", "open", "down") else 0.0,
                    "since": self._since, "failures": self._failures}


class HealthBoard:
    """The health and concurrency slots of every provider, shared by all routes of a process.

    Args:
        providers: by name.
        settings: the breaker and cooldown settings.
        clock: monotonic seconds (tests).
        waiting: entered while a call waits for a provider's ``max_concurrency`` slot.
    """

    def __init__(self, providers: Mapping[str, Provider], settings: HealthSettings | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 waiting: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext) -> None:
        settings = settings or HealthSettings()
        self.waiting = waiting
        self.providers = dict(providers)
        self.health = {name: ProviderHealth(name, settings, clock, p.key_env) for name, p in providers.items()}
        self._slots = {name: threading.BoundedSemaphore(p.max_concurrency)
                       for name, p in providers.items() if p.max_concurrency}

    def of(self, provider: str) -> ProviderHealth:
        return self.health[provider]

    @contextlib.contextmanager
    def slot(self, provider: str) -> Iterator[None]:
        """Holds one of the provider's ``max_concurrency`` call slots (waits for one; FIFO is not
        guaranteed); no-op without a limit. A call that has to wait does so inside ``waiting()``
        (the gateway's turn pool then counts the turn as parked, not in flight: a slow provider
        with a small limit cannot hold every worker while other providers' turns wait)."""
        semaphore = self._slots.get(provider)
        if semaphore is None:
            yield
            return
        if not semaphore.acquire(blocking=False):
            with self.waiting():
                semaphore.acquire()
        try:
            yield
        finally:
            semaphore.release()

    def snapshot(self) -> list[dict[str, Any]]:
        """Every provider's ``ProviderHealth.snapshot`` plus ``base_url``, sorted by name."""
        return [{**self.health[name].snapshot(), "base_url": self.providers[name].base_url}
                for name in sorted(self.health)]


class RouteEvents(Protocol):
    """What a route reports (Prometheus counters in the gateway). Called on the calling thread."""

    def requested(self, provider: str, model: str) -> None:
        """A request was sent to ``provider`` for ``model``."""

    def failed(self, provider: str, model: str, reason: str) -> None:
        """That request failed (``ModelError.reason``)."""

    def failed_over(self, provider: str, model: str, reason: str) -> None:
        """The route moved past this target (``reason``: a failure reason, or a skip: ``cooldown``,
        ``open``, ``down``, ``probing``)."""

    def answered(self, provider: str, model: str, usage: Usage) -> None:
        """This target answered with ``usage``."""


MakeClient = Callable[[Target, bool], ChatModel]
"""Builds the client for a target; the flag says whether it is the route's last target (the only
one that may spend the client's own retries: the others have a fallback)."""


class RoutedModel:
    """A ``ChatModel`` over a route (module doc).

    Args:
        name: the route's name (logs).
        targets: primary first, then the fallbacks.
        make_client: builds each target's client once.
        board: the providers' health, shared with other routes.
        events: counters (``None``: none).

    ``model`` is the primary's model name (the price table's fallback key, ``/status``).
    """

    def __init__(self, name: str, targets: Sequence[Target], make_client: MakeClient, board: HealthBoard,
                 events: RouteEvents | None = None) -> None:
        if not targets:
            raise ValueError(f"route {name!r} has no model")
        self.name = name
        self.targets = list(targets)
        self.clients = [make_client(t, i == len(targets) - 1) for i, t in enumerate(targets)]
        self.board = board
        self.events = events
        self.model = self.targets[0].model

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                 on_text: OnText | None = None) -> ModelReply:
        """The first answer along the route.

        Raises:
            ModelError: a fault of the request (not failed over; ``provider``, ``model`` and, for
                ``context_length``, ``window_tokens`` set), or the last provider fault when every
                target failed or was skipped (``reason == "unavailable"`` when none was asked).
        """
        tried: list[tuple[Target, str]] = []
        last: ModelError | None = None
        asked = 0
        for index, (target, client) in enumerate(zip(self.targets, self.clients, strict=True)):
            provider = target.provider.name
            health = self.board.of(provider)
            skip = health.admit()
            if skip is not None:
                tried.append((target, skip))
                self._moved_on(target, skip, index)
                continue
            asked += 1
            streamed = [False]

            def relay(text: str, _seen: list[bool] = streamed) -> None:
                _seen[0] = True
                on_text(text)  # type: ignore[misc]

            if self.events is not None:
                self.events.requested(provider, target.model)
            try:
                with self.board.slot(provider):
                    reply = client.complete(adapt_messages(messages, target.lacks), tools,
                                            relay if on_text is not None else None)
            except ModelError as exc:
                if streamed[0] and exc.reason in ("connection", "timeout", "stream"):
                    exc.reason = "stream"
                exc.provider, exc.model = provider, target.model
                if self.events is not None:
                    self.events.failed(provider, target.model, exc.reason)
                health.failed(exc.reason, exc.retry_after, _plain(exc, target))
                if not exc.fails_over:
                    if exc.reason == "context_length":
                        exc.window_tokens = target.info.context_window_tokens
                    if exc.reason == "invalid_tools":
                        _report_tools(exc, target, tools)
                    raise
                tried.append((target, exc.reason))
                last = exc
                self._moved_on(target, exc.reason, index)
                continue
            except BaseException:
                health.released()
                raise
            health.succeeded()
            usage = reply.usage if reply.usage.prompt_tokens or reply.usage.completion_tokens \
                else _estimate(messages, tools, reply)
            if self.events is not None:
                self.events.answered(provider, target.model, usage)
            if index and tried:
                log.info("route %s: answered by %s after %s", self.name, target.name,
                         ", ".join(f"{t.name} {why}" for t, why in tried))
            return dataclasses.replace(reply, usage=usage, provider=provider, model=target.model)
        raise self._exhausted(tried, last, asked)

    def _moved_on(self, target: Target, reason: str, index: int) -> None:
        if index == len(self.targets) - 1:
            return
        failover_event(target.provider.name, target.model, reason)
        if self.events is not None:
            self.events.failed_over(target.provider.name, target.model, reason)
        if reason not in ("cooldown", "open", "down", "probing"):
            log.warning("route %s: %s failed (%s); asking %s", self.name, target.name, reason,
                        self.targets[index + 1].name)

    def _exhausted(self, tried: list[tuple[Target, str]], last: ModelError | None, asked: int) -> ModelError:
        detail = "; ".join(f"{t.name}: {why}" for t, why in tried)
        if last is None:
            wait = min(self.board.of(t.provider.name).retry_in() for t in self.targets)
            return ModelError(f"route {self.name}: no model could be asked ({detail})",
                              f"The model is unavailable right now; try again in {max(1, math.ceil(wait))} s.",
                              reason="unavailable")
        if asked == 1 and len(tried) == 1:
            return last
        error = ModelError(f"route {self.name}: every model failed ({detail})",
                           last.user_message if asked == 1 else
                           "None of the configured models could answer right now; try again shortly.",
                           reason=last.reason, status=last.status, retry_after=last.retry_after)
        error.provider, error.model = last.provider, last.model
        return error


def _plain(exc: ModelError, target: Target) -> str:
    """A short description for the Health page and logs (no provider message: it may echo the key)."""
    if exc.reason == "auth":
        return f"it rejected the API key ({exc.status})"
    if exc.status is not None:
        return f"{exc.reason} ({exc.status})"
    return exc.reason


def _report_tools(exc: ModelError, target: Target, tools: list[dict[str, Any]]) -> None:
    """Names the tool a provider refused (``tools[N]`` in its ``param`` or message) in the error."""
    import re

    found = re.search(r"tools\[(\d+)\]", f"{exc.param or ''} {exc}")
    name = None
    if found and int(found.group(1)) < len(tools):
        name = (tools[int(found.group(1))].get("function") or {}).get("name")
    which = f"the tool {name!r}" if name else "a tool definition"
    exc.user_message = (f"The model ({target.name}) refused {which} the gateway offers it; an operator has to "
                        "fix that tool or leave it out (agent.toolset).")
    log.error("model %s refused %s: %s", target.name, which, exc)


def _estimate(messages: list[dict[str, Any]], tools: list[dict[str, Any]], reply: ModelReply) -> Usage:
    """Usage for a reply whose server reported none (``agent.tokens`` estimates; ``estimated``)."""
    out = text_tokens(reply.content or "") + (json_tokens(reply.tool_calls) if reply.tool_calls else 0)
    return Usage(prompt_tokens=request_tokens(messages, tools), completion_tokens=max(1, out), estimated=True)
