"""Run boundaries (DESIGN §6): limits, prices, and the per-task wallet with reservations.

One ``Budget`` tree per task. The root is the task's wallet: iterations (model calls), tokens,
cost and a wall-clock deadline. A sub-agent draws an explicit *reservation*: a child ``Budget``
whose iteration cap is carved out of the parent's free iterations while the child runs; on
``close`` the child's use is charged to the parent and the rest returns. Tokens, cost and the
deadline are shared by the whole tree (they cannot be known per call in advance), so every loop
in the tree checks the root's totals at its step boundaries. The iteration total of a task can
therefore never exceed the root's cap: a child can only spend what was carved out for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from agent.model import Usage

STOP_REASONS = ("iteration_budget", "token_budget", "cost_budget", "wall_clock", "repeated_action")
"""Reasons a budget can end a turn (besides ``stop``, ``length`` and ``cancelled``)."""


@dataclass(frozen=True)
class Price:
    """USD per one million tokens. ``cached_input`` applies to prompt tokens served from cache."""

    input: float
    output: float
    cached_input: float | None = None

    def cost(self, usage: Usage) -> float:
        """USD for one call's ``usage``."""
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cached_rate = self.input if self.cached_input is None else self.cached_input
        return ((usage.prompt_tokens - cached) * self.input + cached * cached_rate
                + usage.completion_tokens * self.output) / 1_000_000


@dataclass(frozen=True)
class Limits:
    """Run boundaries of one task (a turn and every sub-agent it starts). ``None`` = unlimited."""

    iteration_budget: int = 90
    """Model calls per task, sub-agents included."""
    token_budget: int | None = 2_000_000
    """Prompt + completion tokens per task."""
    cost_budget_usd: float | None = 1.0
    """USD per task, priced with ``prices`` (a model without a price costs 0)."""
    wall_clock_s: float | None = 600.0
    """Seconds from the start of the turn; checked at step boundaries."""
    tool_timeout_s: float = 30.0
    """Default per-call timeout of a tool that does not set its own."""
    tool_retries: int = 2
    """Default extra attempts after ``ToolRetry`` (and after a timeout of an idempotent tool)."""
    tool_result_max_chars: int = 16000
    """Central cap of one tool result before it enters the transcript (head and tail kept)."""
    repeat_limit: int = 3
    """Same tool + same arguments + same result this many times ends the turn."""
    max_parallel_tools: int = 4
    """Tool calls of one step run concurrently up to this many."""
    child_iteration_cap: int = 50
    """A sub-agent's own cap; its reservation is never more than the parent has free."""
    child_min_iterations: int = 5
    """No sub-agent starts with less: siblings that cannot each get this many are refused."""
    parent_keep_iterations: int = 1
    """Iterations the parent keeps back from its children to write its answer."""
    max_parallel_children: int = 3
    """Sub-agents one step may start (they run in parallel)."""
    prices: Mapping[str, Price] = field(default_factory=dict)
    """Model name -> price; used for the cost budget and the cost recorded per turn."""

    def price_of(self, model: str, provider: str | None = None) -> Price | None:
        """The price of ``model``: ``provider:model`` first (a provider's own price), then the model
        name; a dated variant (``gpt-4o-mini-2024-07-18``) falls back to its base."""
        if provider is not None and f"{provider}:{model}" in self.prices:
            return self.prices[f"{provider}:{model}"]
        if model in self.prices:
            return self.prices[model]
        matches = [name for name in self.prices if model.startswith(name + "-")]
        return self.prices[max(matches, key=len)] if matches else None


class _Totals:
    """Shared by a budget tree: tokens, cost, deadline, the lock."""

    def __init__(self, limits: Limits, started: float) -> None:
        self.limits = limits
        self.lock = threading.RLock()
        self.tokens = 0
        self.cost_usd = 0.0
        self.deadline = None if limits.wall_clock_s is None else started + limits.wall_clock_s


class Budget:
    """An iteration account in a task's wallet; the root is the wallet itself.

    Thread-safe (one lock per tree): sibling sub-agents run on different threads.
    """

    def __init__(self, cap: int, totals: _Totals, parent: Budget | None = None) -> None:
        self.cap = cap
        """Iterations this account may spend (its own model calls plus its children's)."""
        self.used = 0
        """Iterations spent: own model calls plus those of closed children."""
        self.reserved = 0
        """Iterations carved out for children still running."""
        self.parent = parent
        self._totals = totals
        self._closed = False

    @classmethod
    def wallet(cls, limits: Limits, *, now: float | None = None) -> Budget:
        """A task's root budget, starting its wall clock now."""
        return cls(limits.iteration_budget, _Totals(limits, time.monotonic() if now is None else now))

    @property
    def limits(self) -> Limits:
        return self._totals.limits

    @property
    def free(self) -> int:
        """Iterations this account can still spend or reserve."""
        with self._totals.lock:
            return max(0, self.cap - self.used - self.reserved)

    @property
    def tokens(self) -> int:
        return self._totals.tokens

    @property
    def cost_usd(self) -> float:
        return self._totals.cost_usd

    def exhausted(self, now: float | None = None) -> str | None:
        """The reason no further model call may start, or ``None`` (checked at step boundaries)."""
        totals, limits = self._totals, self._totals.limits
        with totals.lock:
            if self.free <= 0:
                return "iteration_budget"
            if limits.token_budget is not None and totals.tokens >= limits.token_budget:
                return "token_budget"
            if limits.cost_budget_usd is not None and totals.cost_usd >= limits.cost_budget_usd:
                return "cost_budget"
        if totals.deadline is not None and (time.monotonic() if now is None else now) >= totals.deadline:
            return "wall_clock"
        return None

    def spent_before(self, calls: int, tokens: int, cost_usd: float) -> None:
        """Counts what an earlier run of the same task spent (a turn resumed after a restart: its
        stored calls), so a restart does not give the task its budget again."""
        with self._totals.lock:
            self.used += calls
            self._totals.tokens += tokens
            self._totals.cost_usd += cost_usd

    def charge(self, usage: Usage, cost_usd: float) -> None:
        """Records one model call of this account."""
        with self._totals.lock:
            self.used += 1
            self._totals.tokens += usage.prompt_tokens + usage.completion_tokens
            self._totals.cost_usd += cost_usd

    def reserve(self, count: int) -> list[Budget | None]:
        """Reservations for ``count`` sibling sub-agents starting together.

        Each gets ``min(child_iteration_cap, (free - parent_keep_iterations) // count)``; when that
        share is below ``child_min_iterations``, only as many siblings as can each get the minimum
        are granted and the rest get ``None`` (refused: none starts starved). At most
        ``max_parallel_children`` are granted. The shares are carved out at once, so a sibling can
        never spend another's reservation.
        """
        limits = self.limits
        with self._totals.lock:
            spare = max(0, self.free - limits.parent_keep_iterations)
            granted = min(count, limits.max_parallel_children)
            share = min(limits.child_iteration_cap, spare // granted) if granted else 0
            if share < limits.child_min_iterations:
                granted = min(granted, spare // limits.child_min_iterations)
                share = min(limits.child_iteration_cap, spare // granted) if granted else 0
            out: list[Budget | None] = []
            for index in range(count):
                if index < granted:
                    self.reserved += share
                    out.append(Budget(share, self._totals, parent=self))
                else:
                    out.append(None)
            return out

    def close(self) -> None:
        """Ends a reservation: its use is charged to the parent, the unused rest returns."""
        if self.parent is None or self._closed:
            return
        with self._totals.lock:
            self._closed = True
            self.parent.reserved -= self.cap
            self.parent.used += self.used

    def note(self) -> str:
        """The budget line the model reads in its newest message (never in the system prompt)."""
        limits = self.limits
        parts = [f"{self.free} of {self.cap} model calls left"]
        if limits.token_budget is not None:
            parts.append(f"{self.tokens:,} of {limits.token_budget:,} tokens used")
        if limits.cost_budget_usd is not None:
            parts.append(f"${self.cost_usd:.4f} of ${limits.cost_budget_usd:.2f} spent")
        deadline = self._totals.deadline
        if deadline is not None:
            parts.append(f"{max(0, int(deadline - time.monotonic()))} s left")
        return "[budget: " + "; ".join(parts) + "]"


def initial_note(limits: Limits) -> str:
    """The budget line for the user message that starts a task (the same bytes every time)."""
    parts = [f"{limits.iteration_budget} model calls"]
    if limits.token_budget is not None:
        parts.append(f"{limits.token_budget:,} tokens")
    if limits.cost_budget_usd is not None:
        parts.append(f"${limits.cost_budget_usd:.2f}")
    if limits.wall_clock_s is not None:
        parts.append(f"{int(limits.wall_clock_s)} s")
    return "budget for this task: " + ", ".join(parts)
