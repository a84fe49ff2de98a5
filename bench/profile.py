"""Reads a py-spy recording (``py-spy record --format raw``: one collapsed stack per line,
``frame;frame;... count``) into the top functions by own samples and by total samples.

Without ``--idle`` py-spy samples only threads that are running, so samples are proportional to
CPU time: ``share`` is a function's part of the process's busy time.

    python -m bench.profile burst.collapsed [--top 25]
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_REPO = str(Path(__file__).resolve().parents[1]) + "/"
"""This checkout's root: frames of the project's own files are shown relative to it."""
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _name(frame: str) -> str:
    """``function (path/to/module.py:123)`` -> ``function (module.py)``, site-packages trimmed to
    the package path (``sqlalchemy/engine/base.py``)."""
    found = _FRAME.match(frame.strip())
    if not found:
        return frame.strip()
    path = found["file"]
    for marker in ("site-packages/", "/lib/python3", _REPO):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{found['fn']} ({'/'.join(path.split('/')[-3:])})"


@contextlib.contextmanager
def recording(pid: int, out: Path, rate: int = 500) -> Iterator[Path]:
    """Records process ``pid`` with py-spy (a dev dependency) into ``out`` while inside: only the
    thread holding the interpreter lock is sampled (``--gil``: CPU spent in Python), without
    pausing the process (``--nonblocking``)."""
    spy = subprocess.Popen([str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(pid),
                            "--format", "raw", "--rate", str(rate), "--gil", "--nonblocking", "--output", str(out)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached
    try:
        yield out
    finally:
        spy.send_signal(2)  # SIGINT: py-spy writes the file and exits
        spy.wait(30)


def summary(path: Path, top: int = 25) -> dict[str, Any]:
    """``{"samples", "own": [[function, share], ...], "total": [[function, share], ...]}``: the
    ``top`` functions by samples on top of the stack and by samples anywhere on it (shares of all
    samples, 0..1)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_name(f) for f in stack.split(";") if f and not f.startswith("process ")
                  and not f.startswith("thread ")]
        if not frames:
            continue
        samples += n
        own[frames[-1]] += n
        for name in set(frames):
            total[name] += n

    def table(counter: Counter[str]) -> list[list[Any]]:
        kept = [(name, n) for name, n in counter.most_common() if not name.endswith(_GENERIC)][:top]
        return [[name, round(n / max(1, samples), 3)] for name, n in kept]

    return {"samples": samples, "own": table(own), "total": table(total)}


_GENERIC = ("threading.py)", "<frozen runpy>)", "asyncio/runners.py)", "asyncio/base_events.py)",
            "gateway/__main__.py)", "gateway/app/cli.py)", "concurrent/futures/thread.py)", "gateway/bus/pool.py)",
            "contextlib.py)", "asyncio/events.py)", "gateway/ops/metrics.py)")
"""Frames on (nearly) every stack of their thread (thread start, the event loop, the pools): left
out of the tables, which would otherwise open with them."""


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--markdown", action="store_true", help="two Markdown tables instead of JSON")
    args = parser.parse_args()
    figures = summary(args.recording, args.top)
    if not args.markdown:
        print(json.dumps(figures, indent=1))
    else:
        for title in ("own", "total"):
            print(f"\n{figures['samples']} samples; by {title} samples:\n\n| function | share |\n|---|---|")
            for name, share in figures[title]:
                print(f"| `{name}` | {100 * share:.1f} % |")
