"""The agent loop (DESIGN §6): model call -> tool calls -> results written back -> again.

Synchronous; runs on a worker thread. Each step's outcome is a value (``NextStep``): a final
reply, tools to run, or an abort with its reason (a budget ended, the same action repeated, the
turn was cancelled). Every new message is handed to ``record`` as it happens (the gateway writes
it to the transcript), so a crash loses at most the step in flight, and a turn resumed from the
transcript continues where it stopped: tool calls already answered are not run again.

Budgets are checked at step boundaries against the task's ``Budget`` (iterations, tokens, cost,
wall clock); when one ends, the turn ends with one reply that says what was done and why it
stopped, recorded with ``meta.stop_reason``. The model reads its remaining budget in the newest
tool message of each step (and the starting budget in the user message), never in the system
prompt, whose bytes stay identical across turns.

Acceptance checks: when a skill with checks was loaded in the turn (``RunContext.state``), the
model's first answer without tool calls is a draft: the loop asks it once to confirm each check
against its work (``ConfirmChecks``, a host message in the transcript), and its next answer is
the final reply. The turn's last message records ``state.facts()`` (skill versions, the plan).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.bridge import AsyncBridge
from agent.budget import Budget, Limits, Price
from agent.context import RunContext
from agent.execute import ToolOutcome, cap_text, run_calls
from agent.guard import provenance_of
from agent.model import ChatModel, ModelReply, OnText, Usage
from agent.sequence import problems, repair
from agent.tools import ToolRegistry
from agent.tracing import chat, end_chat
from agent.turn_state import TurnState

__all__ = ["INTERRUPTED", "Abort", "ConfirmChecks", "FinalReply", "Limits", "NextStep", "Record", "RunTools",
           "TurnOutcome", "cap_text", "run_turn"]

Record = Callable[[dict[str, Any], Usage | None, dict[str, Any] | None], None]
"""Called with each new model-facing message (assistant or tool), the step's usage (assistant
messages only: each model call's figures exactly once) and facts to store beside it (``cost_usd``
at the configured price, cache discount included, and ``cached_tokens`` when the server reported
any; on the turn's last message ``stop_reason``, ``steps``, ``turn_cost_usd``, ``tokens``)."""

INTERRUPTED = "Error: this tool call was interrupted (the gateway restarted) before it returned a result."

log = logging.getLogger("agent.loop")
UNKNOWN_TOOL = "unknown"
"""``tool_results``' name of a call to a tool that does not exist (the metrics' ``tool`` label)."""


@dataclass(frozen=True)
class FinalReply:
    """The model answered without tool calls."""

    text: str
    finish_reason: str


@dataclass(frozen=True)
class RunTools:
    """The model asked for tools: run them, append the results, call the model again."""

    calls: list[dict[str, Any]]


@dataclass(frozen=True)
class Abort:
    """End the turn before the model finished: ``reason`` is ``cancelled`` or a budget's name."""

    reason: str
    detail: str = ""


@dataclass(frozen=True)
class ConfirmChecks:
    """The model answered, but a loaded skill has acceptance checks: ask it to confirm them first."""

    checks: list[tuple[str, str]]


NextStep = FinalReply | RunTools | Abort | ConfirmChecks

CHECKLIST_REQUEST = (
    "[Before your final answer: you used the skill(s) {skills} in this task. Check your answer above "
    "against each acceptance check below. If one is not met, fix the work first (use tools if you need "
    "to). Then reply with your final answer to the user, complete: it replaces the draft above.]\n{checks}"
)
"""The host's message asking the model to confirm a skill's checklist (role ``user``, ``meta.kind =
"checklist"``: a message of the gateway, not of a person)."""


@dataclass
class TurnOutcome:
    """How a turn ended: the reply to show and why it stopped."""

    reply: str
    stop_reason: str
    """``stop`` | ``length`` | ``cancelled`` | ``iteration_budget`` | ``token_budget`` |
    ``cost_budget`` | ``wall_clock`` | ``repeated_action``."""
    steps: int = 0
    """Model calls made by this loop (a sub-agent's calls count in its own outcome)."""
    usage: list[Usage] = field(default_factory=list)
    cost_usd: float = 0.0
    tool_runs: Counter[str] = field(default_factory=Counter)
    tool_results: Counter[tuple[str, str]] = field(default_factory=Counter)
    """``(tool name, ok | error | rejected)`` -> calls answered by this loop."""


def run_turn(
    *,
    system_prompt: str,
    history: list[dict[str, Any]],
    model: ChatModel,
    tools: ToolRegistry,
    bridge: AsyncBridge | None,
    limits: Limits,
    record: Record,
    should_stop: Callable[[], bool] | None = None,
    budget: Budget | None = None,
    on_text: OnText | None = None,
    context: RunContext | None = None,
) -> TurnOutcome:
    """Runs the loop until the model stops, a budget ends or the turn is cancelled.

    Args:
        system_prompt: the session's stored system prompt (sent byte for byte).
        history: model-facing messages, oldest first, ending with the new user message (or with
            the state a crashed turn left: an assistant ``tool_calls`` message, tool results).
        record: persists each new message before the loop continues.
        should_stop: checked at every step boundary (before each model call); ``True`` ends the
            turn with ``stop_reason == "cancelled"`` (``/stop``, or a newer message interrupting).
        budget: the task's wallet, or a sub-agent's reservation; a fresh wallet from ``limits``
            when omitted.
        on_text: receives the step's text so far while the model streams (chat previews).
        context: per-turn facts for tools (session id, turn id); the loop fills in the rest.

    Raises:
        agent.model.ModelError: the model endpoint failed (an infrastructure fault).
    """
    budget = budget or Budget.wallet(limits)
    state = context.state if context is not None and context.state is not None else TurnState()
    ctx = dataclasses.replace(context or RunContext(), model=model, tools=tools, bridge=bridge, limits=limits,
                              budget=budget, should_stop=should_stop, state=state)
    messages = [{"role": "system", "content": system_prompt}, *history]
    inherited = context.provenance if context is not None and context.depth > 0 else None
    outcome = TurnOutcome(reply="", stop_reason="stop")
    price = limits.price_of(model.model)  # a routed reply is priced as the model that answered
    repeats: Counter[tuple[str, str, str]] = Counter()
    if _answer_pending_tool_calls(messages, tools, ctx, record):
        outcome.stop_reason = "cancelled"  # stopped again while a resumed call waited for a decision
        return outcome
    pending: NextStep | None = None
    while True:
        step = pending or _boundary(should_stop, budget)
        pending = None
        if step is None:
            _validate(messages)
            with chat(model.model, messages) as span:
                # A draft that the checklist may replace is not streamed into the chat.
                drafting = ctx.depth == 0 and not state.checks_asked and bool(state.checklist())
                reply = model.complete(messages, tools.schemas(), None if drafting else on_text)
                answered = _price(limits, reply, price)
                step = _model_step(reply, answered, budget, outcome, messages, record, ctx)
                end_chat(span, reply, answered.cost(reply.usage) if answered is not None else 0.0)
        if isinstance(step, ConfirmChecks):
            state.checks_asked = True
            skills = ", ".join(sorted({name for name, _ in step.checks}))
            request = {"role": "user", "content": CHECKLIST_REQUEST.format(
                skills=skills, checks="\n".join(f"- [ ] {check}" for _, check in step.checks))}
            messages.append(request)
            record(request, None, {"kind": "checklist"})
            continue
        if isinstance(step, FinalReply):
            outcome.reply = step.text
            outcome.stop_reason = "length" if step.finish_reason == "length" else "stop"
            return outcome
        if isinstance(step, Abort):
            outcome.stop_reason = step.reason
            if step.reason != "cancelled":
                outcome.reply = stop_reply(step, outcome, budget)
                message = {"role": "assistant", "content": outcome.reply}
                messages.append(message)
                record(message, None, _summary(outcome, budget, state))
            return outcome
        step_ctx = dataclasses.replace(ctx, provenance=provenance_of(messages, inherited))
        outcomes = run_calls(step.calls, tools, step_ctx)
        results = [result for result in outcomes if not result.suspended]
        _add_budget_note(results, budget)
        for result in results:
            outcome.tool_runs[result.name] += result.ran
            # a name the model made up is counted as "unknown": each would be a metrics series for ever
            outcome.tool_results[(result.name if tools.get(result.name) is not None else UNKNOWN_TOOL,
                                  result.status)] += 1
            messages.append(result.message)
            record(result.message, None, None)
        if len(results) < len(outcomes):  # a call waits for a decision and the gateway stops:
            outcome.stop_reason = "cancelled"  # no result for it; the resumed turn asks again
            return outcome
        pending = _repeated(results, repeats, limits.repeat_limit)


def _validate(messages: list[dict[str, Any]]) -> None:
    """Checks the sequence before a request and repairs it in place rather than send an invalid
    one (an unanswered call gets an "interrupted" result, an orphan tool message is dropped)."""
    found = problems(messages)
    if found:
        log.warning("repaired the message sequence before a model call: %s", "; ".join(found[:5]))
        messages[:] = repair(messages)


def _price(limits: Limits, reply: ModelReply, default: Price | None) -> Price | None:
    """The price of the model that answered (a route's fallback is priced as itself)."""
    if reply.model is None:
        return default
    return limits.price_of(reply.model, reply.provider) or (default if reply.provider is None else None)


def _boundary(should_stop: Callable[[], bool] | None, budget: Budget) -> Abort | None:
    if should_stop is not None and should_stop():
        return Abort("cancelled")
    reason = budget.exhausted()
    return Abort(reason) if reason else None


def _model_step(reply: ModelReply, price: Price | None, budget: Budget, outcome: TurnOutcome,
                messages: list[dict[str, Any]], record: Record, ctx: RunContext) -> NextStep:
    cost = price.cost(reply.usage) if price is not None else 0.0
    budget.charge(reply.usage, cost)
    outcome.steps += 1
    outcome.usage.append(reply.usage)
    outcome.cost_usd += cost
    # content may be null only beside tool calls: an empty answer (a reasoning model that spent its
    # output tokens, a content filter) sent back as null is refused with every later request
    content = reply.content if reply.tool_calls else reply.content or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    messages.append(message)
    step: NextStep = (RunTools(reply.tool_calls) if reply.tool_calls
                      else FinalReply(reply.content or "", reply.finish_reason))
    meta: dict[str, Any] = {"cost_usd": round(cost, 8)}
    if reply.usage.cached_tokens:
        meta["cached_tokens"] = reply.usage.cached_tokens  # the row's columns hold prompt and completion
    if reply.usage.estimated:
        meta["usage_estimated"] = True  # the server reported no usage
    if reply.provider is not None:
        meta["provider"] = reply.provider  # who answered (a route may have failed over)
    if reply.model is not None:
        meta["model"] = reply.model
    state = ctx.state
    if isinstance(step, FinalReply) and state is not None and ctx.depth == 0 and not state.checks_asked \
            and reply.finish_reason != "length" and (checks := state.checklist()):
        step = ConfirmChecks(checks)
        meta["draft"] = True  # answered again after the checklist; this text is not the reply
    elif isinstance(step, FinalReply):
        outcome.stop_reason = "length" if reply.finish_reason == "length" else "stop"
        meta.update(_summary(outcome, budget, state))
    record(message, reply.usage, meta)
    return step


def _summary(outcome: TurnOutcome, budget: Budget, state: TurnState | None = None) -> dict[str, Any]:
    """Facts recorded on a turn's last message: why it stopped, what it cost, and the turn state's
    facts (skill versions used, the plan)."""
    return {**(state.facts() if state is not None else {}), "stop_reason": outcome.stop_reason,
            "steps": outcome.steps, "task_model_calls": budget.used,
            "turn_cost_usd": round(outcome.cost_usd, 8), "task_cost_usd": round(budget.cost_usd, 8),
            "tokens": sum(u.prompt_tokens + u.completion_tokens for u in outcome.usage)}


def _add_budget_note(results: list[ToolOutcome], budget: Budget) -> None:
    """Appends the remaining budget to the step's newest message (stored with it, so the bytes
    sent again in later requests do not change)."""
    if results:
        last = results[-1].message
        last["content"] = f"{last['content']}\n{budget.note()}"


def _repeated(results: list[ToolOutcome], repeats: Counter[tuple[str, str, str]], limit: int) -> Abort | None:
    for result in results:
        key = (result.name, result.args_key, result.result)
        repeats[key] += 1
        if repeats[key] >= limit:
            shown = cap_text(result.result, 200).replace("\n", " ")
            return Abort("repeated_action",
                         f"I called `{result.name}` {repeats[key]} times with the same arguments and got the same "
                         f"result each time ({shown}), so trying again would not help")
    return None


def stop_reply(abort: Abort, outcome: TurnOutcome, budget: Budget) -> str:
    """The one reply a user gets when a boundary ends the turn: why, and what was done."""
    limits = budget.limits
    why = {
        "iteration_budget": f"I reached the iteration budget ({budget.cap} model calls) for this task",
        "token_budget": f"this task used {budget.tokens:,} tokens, the token budget is {limits.token_budget:,}",
        "cost_budget": f"this task cost ${budget.cost_usd:.4f}, the cost budget is ${limits.cost_budget_usd or 0:.2f}",
        "wall_clock": f"this task reached its time limit of {limits.wall_clock_s or 0:g} s",
    }.get(abort.reason, abort.detail or abort.reason)
    done = f"So far I made {outcome.steps} model call{'s' if outcome.steps != 1 else ''}"
    if outcome.tool_runs:
        runs = ", ".join(f"{name} ×{n}" for name, n in sorted(outcome.tool_runs.items()) if n)
        done += f" and ran {runs}" if runs else ""
    return f"⚠️ I stopped before finishing: {why}. {done}. Ask me to continue if you want me to go on."


def _answer_pending_tool_calls(messages: list[dict[str, Any]], tools: ToolRegistry, ctx: RunContext,
                               record: Record) -> bool:
    """After a crash or a stop the transcript may end with tool calls not yet answered: answer
    those only, running again idempotent tools and calls that were waiting for a person's decision
    (``ctx.awaiting``: they never ran), and answering the others as interrupted. Returns whether
    the turn must stop (a call still waits for a decision and the gateway is stopping again)."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message["role"] == "tool":
            continue
        if message["role"] == "assistant" and message.get("tool_calls"):
            answered = {m.get("tool_call_id") for m in messages[index + 1:]}
            missing = [call for call in message["tool_calls"] if call["id"] not in answered]
            rerun = [call for call in missing if ((tool := tools.get(call["function"]["name"])) and tool.idempotent)
                     or (ctx.awaiting is not None and ctx.awaiting(call["id"]))]
            outcomes = run_calls(rerun, tools, dataclasses.replace(ctx, resumed=True)) if rerun else []
            results = {r.message["tool_call_id"]: r.message for r in outcomes if not r.suspended}
            suspended = {r.message["tool_call_id"] for r in outcomes if r.suspended}
            for call in missing:
                if call["id"] in suspended:
                    continue
                result = results.get(call["id"]) or {"role": "tool", "tool_call_id": call["id"], "content": INTERRUPTED}
                messages.append(result)
                record(result, None, None)
            return bool(suspended)
        return False
    return False
