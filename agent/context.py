"""``RunContext``: what a tool may know about the call it serves. Never sent to the model.

The gateway builds one per turn (session id, turn id) and the loop derives one per tool call
(the call id, and for a sub-agent tool its budget reservation). Tools that declare
``takes_context`` receive it as their first argument: the session id is passed explicitly, not
through a thread-local, because a call crosses threads (worker -> tool pool -> bridge loop).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.bridge import AsyncBridge
    from agent.budget import Budget, Limits
    from agent.guard import Provenance
    from agent.model import ChatModel, Usage
    from agent.tools import Tool, ToolRegistry
    from agent.turn_state import TurnState


@dataclass(frozen=True)
class RunContext:
    """Per-call facts and collaborators.

    Attributes:
        session_id: the conversation the call belongs to (browser contexts are kept per session).
        turn_id: the turn (idempotency keys of side-effecting tools derive from it).
        call_id: the model's ``tool_call_id`` of this call (empty outside a call).
        depth: 0 for the turn's own loop, 1 inside a sub-agent.
        model, tools, bridge, limits: those of the loop that made the call.
        budget: the calling loop's budget (a reservation inside a sub-agent).
        reservation: for a ``reserves_budget`` tool, the child budget granted to this call, or
            ``None`` when the wallet refused it.
        should_stop: the turn's cancellation check (``/stop``), shared with sub-agents.
        approver: asks a person whether a side-effecting call may run; ``approver(ctx, tool, args)``
            returns ``None`` when it may, else the reason it may not (the model reads it). It
            blocks the calling thread while it waits. ``None``: nothing needs approval.
        provenance: what a person said and what tools returned so far (``agent.guard``); set by
            the loop before each step's calls.
        redact: removes known secrets from text before it reaches the model (tool results and
            errors); ``None``: no redaction.
        state: the turn's plan and loaded skills (``agent.turn_state``); the loop makes one when
            the caller passes none, and sub-agents share their parent's.
        awaiting: whether the call with this id was waiting for a person's decision when its turn
            stopped (so it never ran): a resumed turn runs such a call again through the approver
            instead of answering it as interrupted. ``None``: no call is known to be waiting.
        resumed: the call is one a stopped turn left unanswered, run again on resume (the approver
            looks for the request it already made instead of asking twice).
        on_child_usage: called with each model call of a sub-agent (``delegate``): its usage and
            the facts its loop records beside it (``provider``, ``model``, ``cost_usd``); called on
            the sub-agent's thread. ``None``: not reported (sub-agents write no transcript).
    """

    session_id: str = ""
    turn_id: str = ""
    call_id: str = ""
    depth: int = 0
    model: ChatModel | None = None
    tools: ToolRegistry | None = None
    bridge: AsyncBridge | None = None
    limits: Limits | None = None
    budget: Budget | None = None
    reservation: Budget | None = None
    should_stop: Callable[[], bool] | None = None
    approver: Approver | None = None
    redact: Callable[[str], str] | None = None
    provenance: Provenance | None = None
    state: TurnState | None = None
    on_child_usage: Callable[[Usage, dict[str, Any]], None] | None = None
    awaiting: Callable[[str], bool] | None = None
    resumed: bool = False


Approver = Callable[[RunContext, "Tool", dict[str, Any]], "str | None"]
"""See ``RunContext.approver``."""
