"""How much disk a session's workspace takes, for its quota (``tools.workspace_max_mb``).

Without file-system quotas (which need root and a file system that has them), a command could fill
the gateway's disk: ``RLIMIT_FSIZE`` bounds one file, not how many. The shell runner measures the
workspace while a command runs (``DiskWatch``) and kills it once over the quota; ``write_file`` and
saved uploads are refused when they would go over. Bytes are counted as allocated (``st_blocks``),
so a sparse file counts what it really takes, and each entry as at least ``ENTRY_BYTES``: an empty
file or a symlink takes no block but an inode, and a quota of blocks alone let a command make
millions of them (the file system's inodes are shared with the gateway's database and files).
Symlinks are not followed; hard links count once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

MIN_INTERVAL_S = 0.25
"""Shortest wait between two measurements while a command runs."""
ENTRY_BYTES = 4096
"""What one file, folder or symlink counts at least (bytes; one block of most file systems): a
1 GB quota allows some 260,000 entries."""


def disk_usage(path: str | os.PathLike[str], stop_above: int | None = None) -> int:
    """Allocated bytes of everything under ``path``, each entry at least ``ENTRY_BYTES`` (not
    following symlinks; hard links once).
    Stops counting once past ``stop_above`` (the result is then only known to exceed it). A
    missing ``path`` or entries vanishing meanwhile count 0."""
    total = 0
    seen: set[tuple[int, int]] = set()
    stack = [os.fspath(path)]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_nlink > 1:
                if (info.st_dev, info.st_ino) in seen:
                    continue
                seen.add((info.st_dev, info.st_ino))
            total += max(info.st_blocks * 512, ENTRY_BYTES)
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
        if stop_above is not None and total > stop_above:
            return total
    return total


class DiskWatch:
    """Measures ``path`` now and then while a command runs: ``over()`` is true once its usage is
    past ``limit`` bytes and above what it was when the command started (a workspace already over
    its quota still lets a command delete files). The wait between measurements grows with what
    one costs (at least ``MIN_INTERVAL_S``, ten times the last measurement's time), so a workspace
    of many files is not walked continuously."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self.at_start = self.used = self._measure()

    def _measure(self) -> int:
        started = time.monotonic()
        used = disk_usage(self.path)
        self._next = time.monotonic() + max(MIN_INTERVAL_S, 10 * (time.monotonic() - started))
        return used

    def over(self, now: float | None = None, force: bool = False) -> bool:
        """Measures when due (or ``force``); whether the command has taken the workspace over."""
        now = time.monotonic() if now is None else now
        if force or now >= self._next:
            self.used = self._measure()
        return self.used > self.limit and self.used > self.at_start
