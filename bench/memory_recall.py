"""Memory recall figures: precision, recall and the time recall adds to a turn, as the owner's
memory grows. Runs the load pipeline's gates 2-4 (``gateway.memory.recall``) on a real database
with the benchmark's 55 facts (``tests/test_memory_benchmark.py``) plus filler entries of the same
owner on unrelated topics, keyword path only:

    python -m bench.memory_recall                       # SQLite in a temporary folder
    python -m bench.memory_recall --db-url postgresql+psycopg://postgres@127.0.0.1:5432/bench

Prints JSON: per owner size, precision, recall and recall latency p50/p95 in ms. The end-to-end
figure through the gateway is the test itself (``pytest -s tests/test_memory_benchmark.py``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from gateway.memory.promote import explicit_request, guess_type
from gateway.memory.recall import Recaller, RecallPolicy
from gateway.memory.store import MemoryStore, NewMemory
from gateway.store.db import create_db_engine, upgrade
from gateway.store.sql import Store
from tests.test_memory_benchmark import FACTS

FILLER_TOPICS = ["invoice", "meeting", "server", "contract", "holiday", "lunch", "backup", "roadmap", "hiring",
                 "expense", "printer", "parking", "badge", "laptop", "onboarding", "training"]


def run(db_url: str, sizes: tuple[int, ...] = (0, 500, 2000)) -> list[dict[str, Any]]:
    """Figures for each filler size (entries added to the owner's 55 facts)."""
    engine = create_db_engine(db_url)
    upgrade(engine)
    Store(engine).purge_all()
    memories = MemoryStore(engine)
    ids = []
    for said, _ in FACTS:
        text = explicit_request(said) or said
        ids.append(memories.add(NewMemory("user:bench", text, guess_type(text), "user_explicit", weight=2.0)).id)
    recaller = Recaller(memories, RecallPolicy())
    figures, filled = [], 0
    for size in sizes:
        for n in range(filled, size):
            topic = FILLER_TOPICS[n % len(FILLER_TOPICS)]
            memories.add(NewMemory("user:bench", f"Note {n} about the {topic} process, item {n * 7 % 101}",
                                   "fact", "import"))
        filled = max(filled, size)
        injected = relevant = 0
        times = []
        for n, (_, question) in enumerate(FACTS):
            started = time.perf_counter()
            block = recaller.block(recaller.recall("user:bench", question))
            times.append((time.perf_counter() - started) * 1000)
            injected += len(block.ids)
            relevant += ids[n] in block.ids
        times.sort()
        figures.append({"entries": len(FACTS) + size, "questions": len(FACTS),
                        "precision": round(relevant / injected, 3) if injected else None,
                        "recall": round(relevant / len(FACTS), 3),
                        "recall_ms_p50": round(statistics.median(times), 2),
                        "recall_ms_p95": round(times[int(len(times) * 0.95) - 1], 2)})
    engine.dispose()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db-url", help="SQLAlchemy URL of an empty scratch database (default: SQLite in a temp dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.db_url or f"sqlite:///{Path(tmp) / 'memory.db'}"
        print(json.dumps({"backend": url.split(":", 1)[0], "figures": run(url)}, indent=1))


if __name__ == "__main__":
    main()
