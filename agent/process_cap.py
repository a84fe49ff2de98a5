"""Caps how many processes one ``run_shell`` command may have (a fork bomb stays inside its cap).

``RLIMIT_NPROC`` alone does not do this: it counts every process of the real user, and root (the
usual user in a container) is exempt from it (Linux ``kernel/fork.c``: ``copy_process`` skips the
check for ``INIT_USER`` and for ``CAP_SYS_RESOURCE``/``CAP_SYS_ADMIN``). So, in order:

  * ``"cgroup"``: a child cgroup of the pids controller (cgroup v1 ``pids`` hierarchy, or cgroup v2
    where ``pids`` is enabled for our cgroup's children) per command, with ``pids.max`` set; the
    command joins it between ``fork`` and ``exec``; when the command ends, every process left in it
    is killed and the cgroup removed. Works for root and in delegated systemd units.
  * ``"rlimit"``: ``RLIMIT_NPROC`` = the user's current process and thread count + the cap, for a
    non-root user where no cgroup can be made.
  * ``"none"``: root without a writable pids cgroup: only the wall-clock timeout bounds a fork bomb.
"""

from __future__ import annotations

import itertools
import os
import resource
import signal
import time
from pathlib import Path
from typing import Literal

CapKind = Literal["cgroup", "rlimit", "none"]

_counter = itertools.count()


def _pids_cgroup_dir() -> Path | None:
    """The directory of this process's cgroup in the pids hierarchy, or ``None`` when there is none."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    v1 = {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        v1[controllers] = path
    for mount in mounts:
        parts = mount.split()
        if len(parts) < 4:
            continue
        point, fstype, options = parts[1], parts[2], parts[3].split(",")
        if fstype == "cgroup" and "pids" in options:
            rel = next((p for c, p in v1.items() if "pids" in c.split(",")), None)
            if rel is not None:
                return Path(point) / rel.lstrip("/")
        if fstype == "cgroup2" and "" in v1:
            base = Path(point) / v1[""].lstrip("/")
            try:
                if "pids" in (base / "cgroup.subtree_control").read_text().split():
                    return base
            except OSError:
                continue
    return None


def _user_tasks(uid: int) -> int:
    """How many processes and threads ``uid`` has now (what ``RLIMIT_NPROC`` counts)."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            total += int(fields.get("Threads", "1").strip())
    return total


class ProcessCap:
    """At most ``max_processes`` processes per command (``kind`` says how it is enforced).

    Use: ``slot = cap.prepare()`` in the parent, ``cap.join(slot)`` in the child before ``exec``,
    ``cap.release(slot)`` in the parent once the command has ended (kills what is left).
    """

    def __init__(self, max_processes: int = 128) -> None:
        if max_processes < 1:
            raise ValueError("max_processes must be at least 1")
        self.max_processes = max_processes
        self._base = self._probe()
        if self._base is not None:
            self.kind: CapKind = "cgroup"
        elif os.geteuid() != 0:
            self.kind = "rlimit"
        else:
            self.kind = "none"

    @staticmethod
    def _probe() -> Path | None:
        base = _pids_cgroup_dir()
        if base is None:
            return None
        probe = base / f"agent-gateway-probe-{os.getpid()}-{next(_counter)}"
        try:
            probe.mkdir()
        except OSError:
            return None
        try:
            (probe / "pids.max").write_text("1")
            ProcessCap._sweep(base)
            return base
        except OSError:
            return None
        finally:
            try:
                probe.rmdir()
            except OSError:
                pass

    @staticmethod
    def _sweep(base: Path) -> None:
        """Removes the cgroups a gateway process that died (kill -9) left behind, with what runs in them."""
        for group in base.glob("agent-gateway-sh-*"):
            owner = group.name.split("-")[3]
            if owner.isdigit() and not Path("/proc", owner).exists():
                ProcessCap.release(group, timeout_s=1.0)

    def describe(self) -> str:
        """One phrase for ``gateway doctor``."""
        if self.kind == "cgroup":
            return f"at most {self.max_processes} processes (pids cgroup)"
        if self.kind == "rlimit":
            return f"at most {self.max_processes} more processes (RLIMIT_NPROC)"
        return "no process cap (root without a writable pids cgroup: the timeout bounds a fork bomb)"

    def prepare(self) -> Path | int | None:
        """Parent side, before ``fork``: a fresh cgroup (its path), the ``RLIMIT_NPROC`` value, or ``None``."""
        if self.kind == "cgroup" and self._base is not None:
            group = self._base / f"agent-gateway-sh-{os.getpid()}-{next(_counter)}"
            try:
                group.mkdir()
                (group / "pids.max").write_text(str(self.max_processes))
                return group
            except OSError:
                return None
        if self.kind == "rlimit":
            return _user_tasks(os.getuid()) + self.max_processes
        return None

    @staticmethod
    def join(slot: Path | int | None) -> None:
        """Child side, between ``fork`` and ``exec`` (``preexec_fn``): enter the cgroup or set the limit."""
        if isinstance(slot, Path):
            with open(slot / "cgroup.procs", "w") as procs:
                procs.write(str(os.getpid()))
        elif isinstance(slot, int):
            resource.setrlimit(resource.RLIMIT_NPROC, (slot, slot))

    @staticmethod
    def release(slot: Path | int | None, timeout_s: float = 5.0) -> None:
        """Parent side, after the command: kill every process left in the cgroup and remove it."""
        if not isinstance(slot, Path):
            return
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pids = [int(p) for p in (slot / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            if not pids:
                try:
                    slot.rmdir()
                    return
                except OSError:
                    pass  # the last ones are still exiting
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
