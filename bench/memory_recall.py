"""Memory recall figures: precision, recall and the time recall adds to a turn, as the owner's
memory grows. Runs the load pipeline's gates 2-4 (``gateway.memory.recall``) on a real database
with the benchmark's 55 facts per language (English and Chinese, ``tests/memory_facts.py``) plus
filler entries of the same owner on unrelated topics in that language, and a second owner with
the same topics and other values; keyword path only:

    python -m bench.memory_recall                       # SQLite in a temporary folder
    python -m bench.memory_recall --db-url postgresql+psycopg://postgres@127.0.0.1:5432/bench

Prints JSON: per language and owner size, precision, recall, entries of the second owner
recalled (always 0) and recall latency p50/p95 in ms. The end-to-end figure through the gateway
is the test itself (``pytest -s tests/test_memory_benchmark.py``).
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
from tests.memory_facts import FACTS, FACTS_ZH, OTHER_USER, OTHER_USER_ZH

FILLER_TOPICS = ["invoice", "meeting", "server", "contract", "holiday", "lunch", "backup", "roadmap", "hiring",
                 "expense", "printer", "parking", "badge", "laptop", "onboarding", "training"]
FILLER_TOPICS_ZH = ["发票", "会议", "服务器", "合同", "假期", "午饭", "备份", "路线图", "招聘", "报销", "打印机",
                    "停车", "工牌", "电脑", "入职", "培训"]
SETS: dict[str, tuple[list[tuple[str, str]], list[str], str]] = {
    "en": (FACTS, OTHER_USER, "Note {n} about the {topic} process, item {item}"),
    "zh": (FACTS_ZH, OTHER_USER_ZH, "第{n}号{topic}流程记录，条目{item}"),
}
FILLERS = {"en": FILLER_TOPICS, "zh": FILLER_TOPICS_ZH}


def _store(memories: MemoryStore, owner: str, said: str) -> int:
    text = explicit_request(said) or said
    return memories.add(NewMemory(owner, text, guess_type(text), "user_explicit", weight=2.0)).id


def run(db_url: str, lang: str = "en", sizes: tuple[int, ...] = (0, 500, 2000)) -> list[dict[str, Any]]:
    """Figures of one language's set for each filler size (entries added to the owner's 55 facts)."""
    facts, other, filler = SETS[lang]
    engine = create_db_engine(db_url)
    upgrade(engine)
    Store(engine).purge_all()
    memories = MemoryStore(engine)
    ids = [_store(memories, "user:bench", said) for said, _ in facts]
    for said in other:
        _store(memories, "user:other", said)
    recaller = Recaller(memories, RecallPolicy())
    figures, filled = [], 0
    for size in sizes:
        for n in range(filled, size):
            topic = FILLERS[lang][n % len(FILLERS[lang])]
            memories.add(NewMemory("user:bench", filler.format(n=n, topic=topic, item=n * 7 % 101), "fact", "import"))
        filled = max(filled, size)
        if engine.dialect.name == "postgresql":  # as autovacuum would: the GIN index's pending list merged,
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # the table known
                conn.exec_driver_sql("VACUUM ANALYZE memories")
        injected = relevant = 0
        times = []
        for n, (_, question) in enumerate(facts):
            started = time.perf_counter()
            block = recaller.block(recaller.recall("user:bench", question))
            times.append((time.perf_counter() - started) * 1000)
            injected += len(block.ids)
            relevant += ids[n] in block.ids
        foreign = sum(1 for _, question in facts for s in recaller.recall("user:bench", question)
                      if s.memory.owner != "user:bench")
        times.sort()
        figures.append({"lang": lang, "entries": len(facts) + size, "questions": len(facts),
                        "precision": round(relevant / injected, 3) if injected else None,
                        "recall": round(relevant / len(facts), 3), "other_owner_hits": foreign,
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
        figures = [f for lang in SETS for f in run(url, lang)]
        print(json.dumps({"backend": url.split(":", 1)[0], "figures": figures}, indent=1))


if __name__ == "__main__":
    main()
