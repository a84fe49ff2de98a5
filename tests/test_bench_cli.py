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
    ("bench.side_by_side", ["--b-root", "/"], "/ is not a checkout of this project"),
    ("bench.side_by_side", ["--b-python", "/nonexistent/python"], "not an executable"),
])
def test_a_nonsense_size_is_refused_in_one_line(module: str, args: list[str], said: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done
    assert said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_side_by_side_runs_each_side_with_its_own_environment_and_interpreter(tmp_path: Path) -> None:
    """Side a on the default loop, side b told to use asyncio's and run by a wrapper of this
    interpreter: each gateway's start-up line says which loop it runs on, the wrapper ran, every
    turn of both sides is answered, and the figures come per round. The same folder again is
    refused (its databases would take every update for a duplicate)."""
    import json

    marker = tmp_path / "wrapper-ran"
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\ntouch "{marker}"\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    keep = tmp_path / "run"
    command = [sys.executable, "-m", "bench.side_by_side", "--mode", "sequential", "--rounds", "2", "--chats", "3",
               "--keep", str(keep), "--a", "GATEWAY__LOGGING__LEVEL=INFO", "--b", "GATEWAY__LOGGING__LEVEL=INFO",
               "--b", "GATEWAY__EVENT_LOOP=asyncio", "--b-python", str(wrapper)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout)
    for side in ("a", "b"):
        runs = figures[side]["runs"]
        assert [run["turns"] for run in runs] == [3, 3] and all(run["lost"] == 0 for run in runs), figures
        assert all(run["loop_ms_per_turn"] > 0 for run in runs), figures
    assert figures["b"]["python"] == str(wrapper) and marker.exists()
    assert "on the uvloop event loop" in (keep / "a" / "bench-0.log").read_text()
    assert "on the asyncio event loop" in (keep / "b" / "bench-0.log").read_text()

    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1, again
    assert again.stderr.strip().splitlines() == [
        f"error: side a: {keep / 'a'} holds an earlier run's database; give --keep a new folder"]


def test_side_by_side_says_in_one_line_why_a_side_did_not_start(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "bench.side_by_side", "--rounds", "1", "--chats", "1",
                           "--b", "GATEWAY__EVENT_LOOP=bogus"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: side b's gateway did not start") and "event_loop" in line, line
