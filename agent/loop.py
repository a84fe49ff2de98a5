"""The agent loop (DESIGN §6): model call -> tool calls -> results written back -> again.

Synchronous; runs on a worker thread. Every new message is handed to ``record`` as it happens
(the gateway writes it to the transcript), so a crash loses at most the step in flight, and a
turn resumed from the transcript continues where it stopped: tool calls already answered are
not run again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.bridge import AsyncBridge, BridgeTimeout
from agent.model import ChatModel, ModelReply, Usage
from agent.tools import ToolRegistry

Record = Callable[[dict[str, Any], Usage | None], None]
"""Called with each new model-facing message (assistant or tool) and the step's usage."""

INTERRUPTED = "Error: this tool call was interrupted (the gateway restarted) before it returned a result."


@dataclass(frozen=True)
class Limits:
    """Run boundaries of one turn."""

    iteration_budget: int = 90
    """Model calls allowed."""
    tool_timeout_s: float = 30.0
    tool_result_max_chars: int = 16000


@dataclass
class TurnOutcome:
    """How a turn ended: the reply to show and why it stopped."""

    reply: str
    stop_reason: str
    """``stop`` | ``length`` | ``iteration_budget`` | ``cancelled``."""
    steps: int = 0
    usage: list[Usage] = field(default_factory=list)


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
) -> TurnOutcome:
    """Runs the loop until the model stops or the iteration budget ends.

    Args:
        system_prompt: the session's stored system prompt (sent byte for byte).
        history: model-facing messages, oldest first, ending with the new user message (or with
            the state a crashed turn left: an assistant ``tool_calls`` message, tool results).
        record: persists each new message before the loop continues.
        should_stop: checked at every step boundary (before each model call); ``True`` ends the
            turn with ``stop_reason == "cancelled"`` (``/stop``, or a newer message interrupting).

    Raises:
        agent.model.ModelError: the model endpoint failed (an infrastructure fault).
    """
    messages = [{"role": "system", "content": system_prompt}, *history]
    outcome = TurnOutcome(reply="", stop_reason="stop")
    _answer_pending_tool_calls(messages, tools, bridge, limits, record)
    while outcome.steps < limits.iteration_budget:
        if should_stop is not None and should_stop():
            outcome.stop_reason = "cancelled"
            return outcome
        reply = model.complete(messages, tools.schemas())
        outcome.steps += 1
        outcome.usage.append(reply.usage)
        assistant = _assistant_message(reply)
        messages.append(assistant)
        record(assistant, reply.usage)
        if not reply.tool_calls:
            outcome.reply = reply.content or ""
            outcome.stop_reason = "length" if reply.finish_reason == "length" else "stop"
            return outcome
        for call in reply.tool_calls:
            result = execute_tool_call(call, tools, bridge, limits)
            messages.append(result)
            record(result, None)
    outcome.stop_reason = "iteration_budget"
    outcome.reply = (
        f"I stopped after {outcome.steps} model calls (the iteration budget for one turn) "
        "before finishing. Ask me to continue if you want me to go on."
    )
    return outcome


def _assistant_message(reply: ModelReply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = reply.tool_calls
    return message


def _answer_pending_tool_calls(
    messages: list[dict[str, Any]], tools: ToolRegistry, bridge: AsyncBridge | None, limits: Limits, record: Record
) -> None:
    """After a crash the transcript may end with tool calls not yet answered: answer those only,
    running idempotent tools again and answering the others as interrupted."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message["role"] == "tool":
            continue
        if message["role"] == "assistant" and message.get("tool_calls"):
            answered = {m.get("tool_call_id") for m in messages[index + 1 :]}
            for call in message["tool_calls"]:
                if call["id"] not in answered:
                    tool = tools.get(call["function"]["name"])
                    if tool is not None and tool.idempotent:
                        result = execute_tool_call(call, tools, bridge, limits)
                    else:
                        result = {"role": "tool", "tool_call_id": call["id"], "content": INTERRUPTED}
                    messages.append(result)
                    record(result, None)
        return


def execute_tool_call(
    call: dict[str, Any], tools: ToolRegistry, bridge: AsyncBridge | None, limits: Limits
) -> dict[str, Any]:
    """Runs one tool call and returns its tool message (always exactly one, same ``tool_call_id``).

    Invalid or non-object JSON arguments, unknown tools, timeouts and tool exceptions become
    error results the model can read; nothing here raises.
    """
    name = call["function"]["name"]
    raw_args = call["function"].get("arguments") or "{}"
    content = _run_tool(name, raw_args, tools, bridge, limits)
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def _run_tool(name: str, raw_args: str, tools: ToolRegistry, bridge: AsyncBridge | None, limits: Limits) -> str:
    tool = tools.get(name)
    if tool is None:
        return f"Error: there is no tool named {name!r}. Available: {', '.join(sorted(tools.tools)) or 'none'}."
    try:
        args = json.loads(raw_args)
    except json.JSONDecodeError as exc:
        return f"Error: the arguments are not valid JSON ({exc.msg} at position {exc.pos}). Send a JSON object."
    if not isinstance(args, dict):
        return "Error: the arguments must be a JSON object."
    timeout = tool.timeout_s or limits.tool_timeout_s
    try:
        if tool.is_async:
            if bridge is None:
                return f"Error: tool {name} needs the async bridge, which is not running."
            result = bridge.run(tool.fn(**args), timeout)
        else:
            result = tool.fn(**args)
    except BridgeTimeout:
        return f"Error: tool {name} timed out after {timeout:g} s."
    except TypeError as exc:
        return f"Error: wrong arguments for {name}: {exc}"
    except Exception as exc:
        return f"Error: {name} failed: {type(exc).__name__}: {exc}"
    text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
    return cap_text(text, limits.tool_result_max_chars)


def cap_text(text: str, max_chars: int) -> str:
    """Keeps head and tail of ``text`` within ``max_chars``, noting the original size."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    omitted = len(text) - 2 * half
    return f"{text[:half]}\n[... {omitted} characters omitted of {len(text)} ...]\n{text[-half:]}"
