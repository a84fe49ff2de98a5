"""A turn's wall-clock timeline inside the gateway: the entry and exit of the functions a plain
turn passes through (``STEPS``), marked in the gateway process and read back as the median offset
of each mark from the webhook handler's entry.

``hook_env(path)`` is the environment that makes a gateway subprocess record: its ``PYTHONPATH``
adds ``bench/timeline_hook``, whose ``sitecustomize`` wraps the ``STEPS`` at interpreter start
(before the gateway imports them, so names imported with ``from ... import`` are wrapped too) and
writes the marks to ``path`` every second and at exit. Recording costs a few microseconds per
mark: compare timelines with each other, not with untimed runs. Nothing in the gateway knows of
it.

    python -m bench.overhead --messages 200 --rate 10 --chats 200 --timeline
"""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

HOOK_DIR = Path(__file__).resolve().parent / "timeline_hook"
ENV = "BENCH_TIMELINE"
"""The environment variable naming the file the marks go to (unset: nothing is recorded).
``BENCH_TIMELINE_EXTRA``: more functions to mark, ``module:Qualified.name`` separated by commas."""
START = "TelegramAdapter._handle_webhook>"
"""The mark each turn's timeline is measured from."""

STEPS: tuple[tuple[str, str], ...] = (
    ("agent.loop", "run_turn"),
    ("adapters.telegram.adapter", "TelegramAdapter._handle_webhook"),
    ("adapters.telegram.adapter", "TelegramAdapter._api"),
    ("gateway.inbound.receive", "Inbound.receive"),
    ("gateway.bus.lanes", "SessionBus.kick"),
    ("gateway.bus.lanes", "SessionBus.claim_free_in"),
    ("gateway.bus.lanes", "SessionBus._drain"),
    ("gateway.store.sql", "Store._claim_next"),
    ("gateway.store.sql", "Store.finish_turn"),
    ("gateway.bus.turns", "TurnRunner._run"),
    ("gateway.bus.turns", "TurnRunner._hand_over"),
    ("gateway.bus.compression", "Compressor.project"),
    ("gateway.memory.service", "MemoryService.annotate"),
    ("agent.model", "OpenAIChatModel.complete"),
    ("agent.model_http", "StreamingEndpoint._send"),  # the streamed call on httpx (llm.http_client)
    ("agent.model_curl", "CurlEndpoint._send"),  # on libcurl, the default
    ("gateway.delivery.outbox", "Delivery.send_claimed"),
    ("gateway.delivery.outbox", "Delivery._send_item"),
    ("gateway.store.tx", "TxScope.__enter__"),
    ("gateway.store.tx", "TxScope.__exit__"),
)
"""``(module, qualified name)`` of each function marked: ``name>`` on entry, ``name<`` on exit."""


def hook_env(path: Path) -> dict[str, str]:
    """The environment (to add to the gateway's) that records its timeline into ``path``."""
    root = str(Path(__file__).resolve().parents[1])
    return {ENV: str(path), "PYTHONPATH": os.pathsep.join([str(HOOK_DIR), root])}


def summarise(path: Path, skip: int = 20, quorum: float = 0.5) -> list[list[Any]]:
    """``[[offset_ms, mark], ...]`` in time order: for each mark, its median offset from the
    turn's ``START``, the ``n``-th occurrence of a mark in a turn counted apart (``mark#n``). Marks
    are cut into turns at each ``START`` (meant for turns one at a time); the first ``skip`` turns
    are left out (warm-up), and marks seen in fewer than ``quorum`` of the turns."""
    marks = sorted(json.loads(path.read_text()))
    turns: list[list[tuple[float, str]]] = []
    for at, mark in marks:
        if mark == START:
            turns.append([])
        if turns:
            turns[-1].append((at, mark))
    offsets: dict[str, list[float]] = defaultdict(list)
    kept = turns[skip:]
    for turn in kept:
        start, seen = turn[0][0], defaultdict(int)
        for at, mark in turn:
            seen[mark] += 1
            offsets[f"{mark}#{seen[mark]}" if seen[mark] > 1 else mark].append((at - start) * 1000)
    rows = [[round(statistics.median(v), 3), mark] for mark, v in offsets.items() if len(v) >= quorum * len(kept)]
    return sorted(rows)
