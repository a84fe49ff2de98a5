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
])
def test_a_nonsense_size_is_refused_in_one_line(module: str, args: list[str], said: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr
