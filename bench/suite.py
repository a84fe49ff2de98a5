"""The benchmark suite: drives the real gateway (a subprocess, Telegram webhook mode) against the
loopback fakes and prints JSON figures. Run on demand, not in the test run:

    python -m bench.suite            # full sizes (several minutes)
    python -m bench.suite --short    # tiny sizes (the test suite runs this so it cannot rot)
    python -m bench.suite --only overhead,load_time

Figures: ``burst``: 200 and 500 first messages of new chats at once with a 2 s model, seconds
to the last reply beside the relay floor's, CPU ms per turn, peak RSS, lost and duplicated replies
(``bench.burst``); ``burst_streamed``: 200 with replies streamed as a model writes them (60 more
words 20 ms apart: a preview each, edited into the reply; the short form's burst streams too);
``overhead_sequential``: update -> model request and reply -> ``sendMessage`` medians and CPU ms
per turn, one new chat at a time (10 msg/s; in the short form with the turn's timeline,
``bench.timeline``, so that tool keeps working too); (a) ``overhead`` per turn p50/p99 at 50 msg/s
beside a bare-relay floor; (b)
``throughput`` at 100 and 500 concurrent conversations with a 2 s model vs the ceiling; (c)
``rss`` with 10k stored and 500 active sessions; (d, e) ``long_conversation``: prefix stability
and input tokens at turn 10/100/500; (f) ``load_time`` of 100 vs 100,000 transcript messages;
(g) ``restart``: seconds from ``/readyz`` to the answers after a kill -9 and immediate restart
(Telegram polling, default 15 s leases; ``bench.restart``); ``admit``: statements, wall and CPU
time of a batch of 32 new chats' admit (``bench.admit``; on PostgreSQL too with ``--postgres``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.admit import run_admit
from bench.burst import run_burst
from bench.harness import work_folder
from bench.overhead import run_image_overhead, run_overhead
from bench.prompt import run_long_conversation
from bench.restart import run_restart
from bench.storage import run_load_time, run_rss
from bench.store_turns import run_store_turns
from bench.throughput import run_throughput

FULL: dict[str, Callable[[Path], Any]] = {
    "burst": lambda d: [run_burst(d / "c200", chats=200, latency_s=2.0),
                        run_burst(d / "c500", chats=500, latency_s=2.0)],
    "burst_streamed": lambda d: run_burst(d, chats=200, latency_s=2.0, tokens=60, token_gap_s=0.02),
    "overhead_sequential": lambda d: run_overhead(d, messages=300, rate=10.0, chats=300),
    "overhead": lambda d: run_overhead(d, messages=1000, rate=50.0, chats=50),
    "image_overhead": lambda d: run_image_overhead(d, messages=100, rate=2.0),
    "throughput": lambda d: [run_throughput(d / "c100", conversations=100, rounds=3, latency_s=2.0),
                             run_throughput(d / "c500", conversations=500, rounds=3, latency_s=2.0)],
    "rss": lambda d: run_rss(d, stored=10_000, active=500),
    "long_conversation": lambda d: run_long_conversation(d, turns=500, checkpoints=(10, 100, 500)),
    "load_time": lambda d: run_load_time(d, small=100, large=100_000),
    "restart": lambda d: run_restart(d, runs=3),
    "store_turns": lambda d: run_store_turns(f"sqlite:///{d / 'store.db'}", turns=400),
    "admit": lambda d: run_admit(d, batch=32, rounds=20),
}

SHORT: dict[str, Callable[[Path], Any]] = {
    # streamed for 1.8 s: text keeps coming past agent.stream_first_after_s, so each reply is a
    # preview edited into it (a reply whose text is complete by then is sent whole, unpreviewed)
    "burst": lambda d: [run_burst(d, chats=5, latency_s=0.2, timeout=20, tokens=6, token_gap_s=0.3)],
    # 0.5 s apart: one turn at a time even on a loaded CI machine (two updates arriving during one
    # write are admitted together, claim_free_many_in, and the timeline's marks would differ)
    "overhead_sequential": lambda d: run_overhead(d, messages=5, rate=2.0, chats=5, warmup=2, timeline=True),
    "overhead": lambda d: run_overhead(d, messages=10, rate=50.0, chats=5, warmup=2),
    "throughput": lambda d: [run_throughput(d, conversations=5, rounds=1, latency_s=0.2, timeout=20)],
    "rss": lambda d: run_rss(d, stored=20, active=5, latency_s=0.3),
    "long_conversation": lambda d: run_long_conversation(d, turns=12, checkpoints=(10,)),
    "load_time": lambda d: run_load_time(d, small=100, large=1000, repeats=3),
    "restart": lambda d: run_restart(d, runs=1),
    "store_turns": lambda d: run_store_turns(f"sqlite:///{d / 'store.db'}", turns=20),
    "admit": lambda d: run_admit(d, batch=4, rounds=1),
}


def run_suite(workdir: Path, *, short: bool = False, only: list[str] | None = None,
              postgres: bool = False) -> dict[str, Any]:
    """Runs the selected benchmarks, each in its own subfolder of ``workdir``; returns the figures.
    ``postgres`` adds the throughput runs and the admit on a scratch database of the local
    PostgreSQL (as ``bench.multi_instance``)."""
    table = dict(SHORT if short else FULL)
    if postgres and not short:
        table["throughput_postgres"] = lambda d: [
            run_throughput(d / "c100", conversations=100, rounds=3, latency_s=2.0, postgres=True),
            run_throughput(d / "c500", conversations=500, rounds=3, latency_s=2.0, postgres=True)]
        table["admit_postgres"] = lambda d: run_admit(d, batch=32, rounds=20, postgres=True)
    figures: dict[str, Any] = {"mode": "short" if short else "full", "python": platform.python_version(),
                               "cpus": os.cpu_count()}
    for name, bench in table.items():
        if only and name not in only:
            continue
        folder = workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        try:
            figures[name] = bench(folder)
        except Exception as exc:  # one broken benchmark must not lose the others' figures
            if short:
                raise
            figures[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"{name}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description="gateway benchmark suite (prints JSON)")
    parser.add_argument("--short", action="store_true", help="tiny sizes (about a minute in all, not an hour)")
    parser.add_argument("--only", help="comma-separated: " + ",".join(FULL) + ",throughput_postgres,admit_postgres")
    parser.add_argument("--postgres", action="store_true", help="also run throughput and the admit on PostgreSQL")
    parser.add_argument("--keep", help="keep the work folder here (the logs)")
    args = parser.parse_args()
    only = [name.strip() for name in args.only.split(",")] if args.only else None
    unknown = sorted(set(only or ()) - {*FULL, "throughput_postgres", "admit_postgres"})
    if unknown:
        parser.error(f"--only: no benchmark named {', '.join(unknown)} "
                     f"(known: {','.join(FULL)},throughput_postgres,admit_postgres)")
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    with work_folder(args.keep, "gw-bench-") as workdir:
        print(json.dumps(run_suite(workdir, short=args.short, only=only, postgres=args.postgres), indent=2))


if __name__ == "__main__":
    main()
