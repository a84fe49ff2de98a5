"""(d) Prefix stability and (e) input tokens per turn over one long conversation.

One DM sends ``turns`` messages, each after the previous reply, to an instant fake model. From
the model requests the fake recorded: the share of turns whose system + tools prefix is byte
identical to the previous turn's (a changed prefix defeats the provider's prompt cache), and the
prompt tokens of turn 10, 100, 500 (the fake counts ``len(json) // 4``; the gateway's history
window and any compression decide how this grows).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import aiohttp

from bench.harness import CHAT_BASE, last_user_line, post, rig, update, wait_for
from gateway.bus.compression import SUMMARY_PROMPT
from tests.fakes import openai as oa


def _prefix(body: dict[str, Any]) -> str:
    system = [m for m in body["messages"] if m["role"] == "system"]
    return json.dumps([system[:1], body.get("tools")], sort_keys=False, ensure_ascii=False)


def _is_summary_call(body: dict[str, Any]) -> bool:
    first = body["messages"][0] if body["messages"] else {}
    return first.get("role") == "system" and str(first.get("content", "")).startswith(SUMMARY_PROMPT[:40])


def run_long_conversation(workdir: Path, *, turns: int = 500, checkpoints: tuple[int, ...] = (10, 100, 500)
                          ) -> dict[str, Any]:
    """Runs the conversation; returns prefix stability and prompt tokens at the checkpoints."""
    with rig(workdir) as r:
        r.model.responder = lambda req: oa.text(f"Noted: {last_user_line(req)}. " + "Some detail. " * 20, pieces=1)
        asyncio.run(_converse(r, turns))
        answered = [q for q in r.model.requests if q["status"] == 200]
    # Turn requests only: a summarising call (compression) is a different request with its own prompt.
    requests = [q for q in answered if not _is_summary_call(q["json"])]
    prefixes = [_prefix(q["json"]) for q in requests]
    same = sum(1 for a, b in itertools.pairwise(prefixes) if a == b)
    tokens = {f"turn_{n}": requests[n - 1]["prompt_tokens"] for n in checkpoints if n <= len(requests)}
    cached = {f"turn_{n}": requests[n - 1]["cached_tokens"] for n in checkpoints if n <= len(requests)}
    return {"turns": turns, "model_requests": len(answered), "summary_calls": len(answered) - len(requests),
            "prefix_stable_share": round(same / max(1, len(prefixes) - 1), 4),
            "input_tokens": tokens, "cached_tokens": cached}


async def _converse(r: Any, turns: int) -> None:
    chat = CHAT_BASE + 424_242
    async with aiohttp.ClientSession() as http:
        for index in range(turns):
            await post(http, r.webhook, update(chat, 1 + index, f"question number {index}: tell me more"))
            if not await wait_for(lambda i=index: len(r.telegram.calls("sendMessage")) > i, 30, 0.005):
                raise TimeoutError(f"no reply to turn {index}")
