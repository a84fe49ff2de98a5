"""The store's share of a new chat's turn, replayed without the gateway: what the lane's claim and
the turn's finish cost in statements, wall-clock and CPU time, on SQLite or PostgreSQL.

Each turn is the first message of a new chat: its inbox row is stored (not counted), the lane is
taken with a prefetch that opens (creates) the session, and ``Store.finish_turn`` writes the user
message and the reply, queues the reply already claimed (not streamed: no preview took its row),
marks the inbox row and gives the lane up
(``LaneNext``). ``--claim admit`` (what the gateway does for a new chat) takes the lane in the
inbox row's own transaction (``Store.claim_free_lane_in``); ``--claim apart`` in a transaction of
its own (``Store.claim_next``, the way into a lane that exists). ``--claim existing`` replays a
chat's second turn instead (after its first, not counted): the lane exists and is free, so it is
claimed in the inbox row's transaction as the gateway does (``Store.claim_free_lane_in``), and the
prefetch reads the session with its summary and window.
One thread, one turn after the other: the figures are the store's own, without the contention of a
burst.

    python -m bench.store_turns [--turns 400] [--claim admit|apart|existing] [--postgres URL]

Prints JSON: ``backend``, ``claim``, ``turns``, ``statements_per_turn`` (planned statements run by
the claim and the finish), ``wall_us_per_turn``, ``cpu_us_per_turn``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import gateway.store.outbox as store_outbox
import gateway.store.sql as store_sql
from gateway.core.types import ChatAddress, InboundMessage, OutboundMessage, Sender
from gateway.store.db import create_db_engine, upgrade, write_tx
from gateway.store.sql import LaneNext, NewMessage, Prefetch, Store

WARMUP = 50


_RUNNERS = (store_sql, store_outbox)
"""The store's modules that run planned statements (``gateway.store.fast.execute``, as ``run``)."""


def run_store_turns(db_url: str, turns: int = 400, claim: str = "admit") -> dict[str, Any]:
    """Replays ``turns`` new chats' claim and finish on ``db_url`` (an empty, writable database:
    migrated here; on PostgreSQL every table is emptied first); ``claim``: ``admit`` or ``apart``
    (above). Returns the figures above."""
    engine = create_db_engine(db_url)
    upgrade(engine)
    store = Store(engine)
    store.purge_all()
    counted = [0]
    planned = store_sql.run

    def counting(conn: Any, statement: Any, params: Any = None) -> Any:
        counted[0] += 1
        return planned(conn, statement, params)

    def opened(conn: Any, batch: list[Any], fresh: bool) -> Any:  # what the gateway's prefetch does for a new chat
        return store.open_session_in(conn, batch[-1].session_key, lambda: "You are a helpful assistant.", 40,
                                     fresh=fresh)

    def turn(chat: str, number: int = 1) -> None:
        key = f"telegram:bench:dm:{chat}"
        message = InboundMessage(ChatAddress("telegram", "bench", chat), f"{chat}:{number}", "dm",
                                 Sender(chat, "A"), "hello, can you help me plan a trip?")
        first = Prefetch(opened)
        if number == 0 or claim in ("admit", "existing"):
            with write_tx(engine) as conn:
                store.insert_inbound_in(conn, message, key)
                started = counted[0]
                claimed = store.claim_free_lane_in(conn, key, "bench", 60, 1, first)
            first.commit()
        else:
            store.insert_inbound(message, key)
            started = counted[0]
            claimed = store.claim_next(key, "bench", 60, 1, first)
        assert claimed is not None and first.value is not None
        (pending,), generation = claimed
        turn_id = f"in{pending.inbox_id}"
        reply = f"reply:{chat}:{number}"
        store.finish_turn([pending.inbox_id], "done", [OutboundMessage(message.address, "Sure!", reply)],
                          session_id=first.value.session_id, session_key=key, generation=generation,
                          messages=[NewMessage(turn_id, "user", message.text, {}),
                                    NewMessage(turn_id, "assistant", "Sure!", {})],
                          stream_key=[reply, f"{reply}:plan"], claim=("bench", 60.0),
                          then=LaneNext(key, "bench", 1, Prefetch(opened)), streamed=False)
        statements.append(counted[0] - started)

    statements: list[int] = []
    for module in _RUNNERS:  # counts what the store runs planned
        module.run = counting  # type: ignore[attr-defined]
    try:
        run_id = uuid.uuid4().hex[:6]
        if claim == "existing":  # the chats' first turns, not measured
            for n in range(turns):
                turn(f"{run_id}{n}", 0)
        for n in range(WARMUP):
            if claim == "existing":
                turn(f"w{run_id}{n}", 0)
            turn(f"w{run_id}{n}")
        statements.clear()
        wall, cpu = time.perf_counter(), time.process_time()
        for n in range(turns):
            turn(f"{run_id}{n}")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        # the inbox rows' own cost, measured alone and taken off
        inbox_wall, inbox_cpu = time.perf_counter(), time.process_time()
        for n in range(turns):
            chat = f"x{run_id}{n}"
            store.insert_inbound(InboundMessage(ChatAddress("telegram", "bench", chat), f"{chat}:1", "dm",
                                                Sender(chat, "A"), "hello"), f"telegram:bench:dm:{chat}")
        inbox_wall, inbox_cpu = time.perf_counter() - inbox_wall, time.process_time() - inbox_cpu
    finally:
        for module in _RUNNERS:
            module.run = planned  # type: ignore[attr-defined]
        engine.dispose()
    return {"backend": engine.dialect.name, "claim": claim, "turns": turns,
            "statements_per_turn": sum(statements) / len(statements),
            "wall_us_per_turn": round((wall - inbox_wall) / turns * 1e6, 1),
            "cpu_us_per_turn": round((cpu - inbox_cpu) / turns * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--claim", choices=("admit", "apart", "existing"), default="admit",
                        help="a new chat's lane taken in its inbox row's transaction, or in one of its own; "
                             "or a chat's second turn (its lane exists and is free: taken in the inbox row's "
                             "transaction)")
    parser.add_argument("--postgres", metavar="URL", help="an empty PostgreSQL database (its tables are emptied)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        url = args.postgres or f"sqlite:///{Path(folder) / 'store.db'}"
        print(json.dumps(run_store_turns(url, args.turns, args.claim), indent=2))


if __name__ == "__main__":
    main()
