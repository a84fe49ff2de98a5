"""Two gateways side by side, measured in alternation: an A/B that a machine's drift cannot decide.

On the shared 2-core machines these figures come from, the same code's CPU per turn moves by 20-40 %
between runs minutes apart, more than most changes under test. Here both sides run at once (each its
own fakes and SQLite database, started once) and take turns: round ``k`` measures ``a`` then ``b``,
round ``k + 1`` ``b`` then ``a``, so drift falls on both alike. A side is a set of environment
variables (config overrides such as ``GATEWAY__EVENT_LOOP=asyncio``) and, optionally, a checkout
to run the gateway from (``--b-root /tmp/wt-base``: ``PYTHONPATH`` points there), or the
interpreter to run it on (``--b-python /opt/venv/bin/python``: a virtualenv with the project's
dependencies installed, e.g. on another CPython build).

Per round and side: the process's CPU milliseconds per turn (its idle rate subtracted), the event
loop thread's (the main thread: ``/proc/<pid>/task/<pid>/schedstat``, nanoseconds), and in
``burst`` mode (``chats`` new chats at once, a model that takes ``latency`` s) the seconds to the
last reply and what was lost or duplicated; in ``sequential`` mode (``chats`` new chats at
``rate``/s, an instant model) update -> model request and reply -> ``sendMessage`` medians.
``b_lower``: in how many rounds ``b``'s figure was below ``a``'s. The process's CPU is counted in
the kernel's 10 ms ticks: give a round 100 turns or more (the loop thread's count is exact).

    python -m bench.side_by_side --b GATEWAY__EVENT_LOOP=asyncio --mode burst --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench.burst import _burst
from bench.harness import (
    cpu_seconds,
    idle_cpu_per_s,
    last_user_line,
    non_negative,
    positive_int,
    positive_rate,
    rig,
    update,
    work_folder,
)
from bench.overhead import _drive, _Stamps
from tests.fakes import openai as oa


class SideFailed(Exception):
    """A side's gateway did not start, or a round of it answered nothing: the message says why
    (with the last lines of that side's log)."""


def _log_tail(workdir: Path, lines: int = 3) -> str:
    logs = sorted(workdir.glob("bench-*.log"))
    text = logs[-1].read_text(errors="replace").strip().splitlines() if logs else []
    return " | ".join(text[-lines:]) or "(no log)"


def loop_cpu_seconds(pid: int) -> float:
    """CPU seconds of process ``pid``'s main thread (the gateway's event loop), from the scheduler's
    own count (Linux ``/proc/<pid>/task/<pid>/schedstat``: nanoseconds on the CPU)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def environment(text: str) -> tuple[str, str]:
    """``argparse`` type: ``NAME=VALUE``."""
    name, sep, value = text.partition("=")
    if not sep or not name or not name.replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"not NAME=VALUE: {text!r}")
    return name, value


def interpreter(text: str) -> str:
    """``argparse`` type: an executable file (a Python interpreter)."""
    import os

    if not (os.path.isfile(text) and os.access(text, os.X_OK)):
        raise argparse.ArgumentTypeError(f"not an executable: {text!r}")
    return text


def checkout(text: str) -> str:
    """``argparse`` type: a checkout of this project (a folder with ``gateway/__main__.py``)."""
    if not (Path(text) / "gateway" / "__main__.py").is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a checkout of this project (no gateway/__main__.py)")
    return str(Path(text).resolve())


def _side_env(pairs: list[tuple[str, str]], root: str | None) -> dict[str, str]:
    return {**dict(pairs), **({"PYTHONPATH": root} if root is not None else {})}


def _measure(r: Any, pid: int, idle: float, mode: str, tag: str, chats: int, first: int, rate: float,
             stamps: _Stamps) -> dict[str, Any]:
    time.sleep(0.5)  # the previous measurement's stragglers (duplicates would show in its own count)
    cpu0, loop0, wall0 = cpu_seconds(pid), loop_cpu_seconds(pid), time.monotonic()
    row: dict[str, Any]
    if mode == "burst":
        got = asyncio.run(_burst(r.webhook, r, tag, chats, first, 120))
        turns = got["answered"]
        row = {"seconds": got["seconds"], "lost": len(got["lost"]), "duplicated": len(got["duplicated"])}
    else:
        got = asyncio.run(_drive(r.webhook, r, tag, chats, rate, chats, stamps, 60 + chats / rate,
                                 make=lambda chat, message_id, text: update(chat + first, message_id, text)))
        turns = got["completed"]
        row = {"inbound_to_model_p50_ms": got["inbound_to_model"]["p50_ms"],
               "model_to_platform_p50_ms": got["model_to_platform"]["p50_ms"], "lost": chats - turns}
    cpu = cpu_seconds(pid) - cpu0 - idle * (time.monotonic() - wall0)
    loop = loop_cpu_seconds(pid) - loop0
    return {"turns": turns, "cpu_ms_per_turn": round(1000 * max(cpu, 0.0) / max(1, turns), 2),
            "loop_ms_per_turn": round(1000 * loop / max(1, turns), 3), **row}


def run_side_by_side(workdir: Path, a: dict[str, str], b: dict[str, str], *, mode: str = "burst",
                     rounds: int = 6, chats: int = 200, rate: float = 20.0, latency_s: float = 2.0,
                     pythons: tuple[str | None, str | None] = (None, None)) -> dict[str, Any]:
    """Starts both gateways (``a``, ``b``: environment added to each; ``pythons``: each side's
    interpreter, default this one), warms each with 5 turns,
    then runs ``rounds`` alternating measurements. Returns ``{"mode", "rounds", "chats", "a": {"env",
    "runs": [...], "median": {...}}, "b": {...}, "b_lower": {figure: "k/rounds"}}``.

    Raises:
        SideFailed: a side's folder holds an earlier run's database, its gateway did not start, or
            a round of it answered no turn.
    """
    stamps = _Stamps()

    def responder(request: dict[str, Any]) -> oa.Reply:
        if mode == "sequential":
            return stamps.responder(request)
        return oa.delay(latency_s, oa.text(f"re: {last_user_line(request)}", pieces=3))

    sides: dict[str, dict[str, Any]] = {"a": {"env": a, "python": pythons[0] or sys.executable, "runs": []},
                                        "b": {"env": b, "python": pythons[1] or sys.executable, "runs": []}}
    with contextlib.ExitStack() as stack:
        rigs: dict[str, Any] = {}
        for name, env, python in (("a", a, pythons[0]), ("b", b, pythons[1])):
            if (workdir / name / "gateway.db").exists():  # its update ids would repeat: every webhook a duplicate
                raise SideFailed(f"side {name}: {workdir / name} holds an earlier run's database; "
                                 "give --keep a new folder")
            try:
                rigs[name] = stack.enter_context(rig(workdir / name, env=env, python=python, pool_size=20))
            except (RuntimeError, TimeoutError) as exc:
                raise SideFailed(f"side {name}'s gateway did not start ({exc}): {_log_tail(workdir / name)}") from None
        idle: dict[str, float] = {}
        for name, r in rigs.items():
            r.model.responder = responder
            asyncio.run(_burst(r.webhook, r, "warm", 5, 900_000, 30))  # imports, first connections
            idle[name] = idle_cpu_per_s(r.gateway.proc.pid)  # type: ignore[union-attr]
        for k in range(rounds):
            for name in ("a", "b") if k % 2 == 0 else ("b", "a"):
                r = rigs[name]
                run = _measure(r, r.gateway.proc.pid, idle[name], mode, f"{name}{k}", chats, k * chats, rate, stamps)
                if run["turns"] == 0:
                    raise SideFailed(f"side {name}, round {k + 1}: no turn was answered: {_log_tail(workdir / name)}")
                sides[name]["runs"].append(run)
    figures = [f for f in sides["a"]["runs"][0] if f not in ("turns", "lost", "duplicated")]
    for side in sides.values():
        side["median"] = {f: round(statistics.median(run[f] for run in side["runs"]), 3) for f in figures}
    lower = {f: sum(rb[f] < ra[f] for ra, rb in zip(sides["a"]["runs"], sides["b"]["runs"], strict=True))
             for f in figures}
    return {"mode": mode, "rounds": rounds, "chats": chats, **sides,
            "b_lower": {f: f"{n}/{rounds}" for f, n in lower.items()}}


if __name__ == "__main__":
    import json
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", type=environment, action="append", default=[], metavar="NAME=VALUE",
                        help="environment of side a (repeatable)")
    parser.add_argument("--b", type=environment, action="append", default=[], metavar="NAME=VALUE",
                        help="environment of side b (repeatable)")
    parser.add_argument("--a-root", type=checkout, help="run side a's gateway from this checkout (default: this one)")
    parser.add_argument("--b-root", type=checkout, help="run side b's gateway from this checkout (default: this one)")
    parser.add_argument("--a-python", type=interpreter, help="run side a's gateway on this interpreter")
    parser.add_argument("--b-python", type=interpreter, help="run side b's gateway on this interpreter")
    parser.add_argument("--mode", choices=["burst", "sequential"], default="burst")
    parser.add_argument("--rounds", type=positive_int, default=6)
    parser.add_argument("--chats", type=positive_int, default=200, help="new chats per side and round")
    parser.add_argument("--rate", type=positive_rate, default=20.0, help="sequential: messages per second")
    parser.add_argument("--latency", type=non_negative, default=2.0, help="burst: the model's seconds")
    parser.add_argument("--keep", help="keep the work folder here (both sides' logs and databases)")
    args = parser.parse_args()
    side_a, side_b = _side_env(args.a, args.a_root), _side_env(args.b, args.b_root)
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    with work_folder(args.keep, "gw-side-by-side-") as folder:
        try:
            figures = run_side_by_side(folder, side_a, side_b, mode=args.mode, rounds=args.rounds, chats=args.chats,
                                       rate=args.rate, latency_s=args.latency, pythons=(args.a_python, args.b_python))
        except SideFailed as exc:
            raise SystemExit(f"error: {exc}") from None
    print(json.dumps(figures, indent=2))
