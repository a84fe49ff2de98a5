"""The benchmarks' command lines refuse sizes that make no sense with argparse's one-line error
(exit 2) before anything starts, instead of an empty run or a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("module", "args", "said"), [
    ("bench.burst", ["--chats", "0"], "--chats: must be at least 1"),
    ("bench.burst", ["--latency", "-1"], "--latency: must be 0 or more"),
    ("bench.workers", ["--processes", "0"], "--processes: must be at least 1"),
    ("bench.workers", ["--processes", "abc"], "--processes: not a whole number"),
    ("bench.overhead", ["--rate", "0"], "--rate: must be more than 0"),
    ("bench.multi_instance", ["--instances", "0"], "--instances: must be at least 1"),
    ("bench.suite", ["--only", "bogus"], "no benchmark named bogus"),
    ("bench.side_by_side", ["--rounds", "0"], "--rounds: must be at least 1"),
    ("bench.side_by_side", ["--b", "GATEWAY__EVENT_LOOP"], "not NAME=VALUE"),
])
def test_a_nonsense_size_is_refused_in_one_line(module: str, args: list[str], said: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_side_by_side_runs_each_side_with_its_own_environment(tmp_path: Path) -> None:
    """Side a on the default loop, side b told to use asyncio's: each gateway's start-up line says
    which loop it runs on, every turn of both is answered, and the figures come per round."""
    import json

    done = subprocess.run([sys.executable, "-m", "bench.side_by_side", "--mode", "sequential", "--rounds", "2",
                           "--chats", "3", "--keep", str(tmp_path), "--a", "GATEWAY__LOGGING__LEVEL=INFO",
                           "--b", "GATEWAY__LOGGING__LEVEL=INFO", "--b", "GATEWAY__EVENT_LOOP=asyncio"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    for side in ("a", "b"):
        runs = figures[side]["runs"]
        assert [run["turns"] for run in runs] == [3, 3] and all(run["lost"] == 0 for run in runs), figures
        assert all(run["loop_ms_per_turn"] > 0 for run in runs), figures
    assert figures["b_lower"]["loop_ms_per_turn"] in {"0/2", "1/2", "2/2"}
    assert "on the uvloop event loop" in (tmp_path / "a" / "bench-0.log").read_text()
    assert "on the asyncio event loop" in (tmp_path / "b" / "bench-0.log").read_text()


def test_side_by_side_refuses_a_root_that_is_not_a_checkout(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.side_by_side", "--b-root", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "is not a checkout of this project" in done.stderr, done
    assert "Traceback" not in done.stderr
