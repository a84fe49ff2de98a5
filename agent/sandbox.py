"""Runs one shell command for ``run_shell`` with limits (issues 9 and 17).

Always enforced:
  * wall-clock timeout: the whole process group (and, with namespaces, the whole PID namespace)
    is killed;
  * output cap: stdout+stderr beyond ``max_output_bytes`` is not read; the command is killed;
  * resource limits (``setrlimit``): CPU seconds, address space, file size, open files;
  * a process cap (``agent.process_cap``): at most ``max_processes`` processes per command, so a
    fork bomb cannot starve the gateway or the host of processes; what is left when the command
    ends is killed;
  * a scrubbed environment: only ``PATH``, ``HOME`` (the workspace), ``LANG``, ``TMPDIR`` —
    no secrets from the gateway's environment;
  * a disk quota (``run``'s ``max_disk_bytes``, ``agent.disk_quota``): the command is killed once
    it has taken its workspace over it.

Isolation (``Sandbox.isolation``, the best one that works on the host, as ``gateway doctor`` says):
  * ``"bubblewrap"`` (Debian package ``bubblewrap``, ``bwrap``): new user, PID, network, IPC and
    UTS namespaces and its own file system: the session's workspace (read-write, at its real
    path), ``/usr`` and the ``/bin``/``/lib`` links read-only, a few ``/etc`` files programs need
    (loader cache, alternatives, passwd/group, time zone, TLS roots), a fresh ``/proc``, a
    minimal ``/dev`` and an empty ``/tmp`` (a tmpfs of ``tmp_bytes``). Nothing else of the host exists: not ``/home``,
    ``/root``, ``/srv``, ``/var``, other sessions' workspaces, the gateway's config or database.
  * ``"namespaces"`` (util-linux ``unshare``): new user, network and PID namespaces only: no
    network and no view of the gateway's processes, but the host's file system is readable with
    the gateway user's rights.
  * ``"none"``: the limits above only.
No network (only a down loopback) unless ``allow_network`` under both isolations; no seccomp filter.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.disk_quota import DiskWatch
from agent.execute import cap_text
from agent.process_cap import ProcessCap


@dataclass(frozen=True)
class ShellResult:
    """``exit_code`` (``None`` when killed), combined output, and why it was cut short."""

    exit_code: int | None
    output: str
    timed_out: bool = False
    truncated: bool = False
    disk_full: int | None = None
    """The workspace quota in bytes, when the command was killed for going over it."""

    def describe(self) -> str:
        """The text the model reads."""
        notes = []
        if self.timed_out:
            notes.append("killed: time limit reached")
        if self.truncated:
            notes.append("killed: output limit reached")
        if self.disk_full is not None:
            over = f"the workspace is over its {self.disk_full >> 20} MB quota; delete files before writing more"
            notes.append(f"killed: {over}" if self.exit_code is None else over)
        head = f"exit code: {self.exit_code if self.exit_code is not None else 'none'}"
        if notes:
            head += f" ({'; '.join(notes)})"
        return f"{head}\n{self.output}"


Isolation = Literal["bubblewrap", "namespaces", "none"]
MAX_FILE_BYTES = 100 << 20
"""Largest file a command may write (``RLIMIT_FSIZE``), and at most the workspace's quota."""

_ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
              "localtime", "timezone", "mime.types", "ssl", "ca-certificates", "ca-certificates.conf",
              "host.conf", "hosts", "resolv.conf", "gai.conf", "protocols", "services", "magic", "inputrc")
"""``/etc`` entries visible (read-only) inside bubblewrap: what ordinary commands need, no secrets."""
_ROOT_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@functools.lru_cache(maxsize=1)
def _bwrap_sizes_tmpfs() -> bool:
    """Whether this ``bwrap`` takes ``--size`` for a tmpfs (bubblewrap 0.7 and later)."""
    try:
        done = subprocess.run(["bwrap", "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return b"--size" in done.stdout + done.stderr


def _bwrap_prefix(cwd: Path, allow_network: bool, tmp_bytes: int | None = None) -> list[str]:
    """``bwrap`` arguments that show the command only ``cwd`` (read-write) and the system read-only;
    ``/tmp`` is a tmpfs of at most ``tmp_bytes`` (in memory: unbounded, a command could take the
    host's RAM) where bwrap can size it."""
    argv = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    if allow_network:
        argv.append("--share-net")
    for name in _ROOT_LINKS:  # merged /usr: symlinks into /usr; otherwise real directories
        path = Path("/") / name
        if path.is_symlink():
            argv += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            argv += ["--ro-bind", str(path), str(path)]
    for name in _ETC_FILES:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    sized = tmp_bytes is not None and _bwrap_sizes_tmpfs()
    size = ["--size", str(tmp_bytes)] if sized else []
    # /dev is a tmpfs too (the device nodes): read-only, or it would be RAM without a bound; its
    # shm, for programs that need shared memory, is sized like /tmp
    argv += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             *size, "--tmpfs", "/tmp", "--bind", str(cwd), str(cwd), "--chdir", str(cwd), "--"]
    return argv


@functools.lru_cache(maxsize=4)
def probe(isolation: Isolation) -> str | None:
    """``None`` when ``isolation`` runs a trivial command on this host, else why not (one line:
    the program missing, or its own error, e.g. ``bwrap: No permissions to create new namespace``).
    Probed once per process (at most 10 s)."""
    if isolation == "bubblewrap":
        if shutil.which("bwrap") is None:
            return "bwrap is not installed (Debian package bubblewrap)"
        argv = [*_bwrap_prefix(Path("/tmp"), allow_network=False), "true"]
    elif isolation == "namespaces":
        if shutil.which("unshare") is None:
            return "unshare is not installed (Debian package util-linux)"
        argv = ["unshare", "-rn", "--pid", "--fork", "--kill-child", "true"]
    else:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{argv[0]}: {type(exc).__name__}: {exc}"
    if done.returncode == 0:
        return None
    lines = [line.strip() for line in done.stderr.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else f"{argv[0]} exited with status {done.returncode}"


def _works(isolation: Isolation) -> bool:
    return probe(isolation) is None


def best_isolation(use_namespaces: bool = True) -> Isolation:
    """``"bubblewrap"`` if ``bwrap`` works here, else ``"namespaces"`` if ``unshare`` does, else ``"none"``."""
    if not use_namespaces:
        return "none"
    return next((i for i in ("bubblewrap", "namespaces") if _works(i)), "none")


class Sandbox:
    """Shell runner. ``isolation`` says what is active (``bubblewrap``, ``namespaces`` or ``none``).

    Args:
        timeout_s: wall-clock limit per command.
        max_output_bytes: output read before the command is killed.
        cpu_s: CPU seconds (RLIMIT_CPU).
        memory_bytes: address space (RLIMIT_AS).
        max_processes: processes one command may have at once (see ``agent.process_cap``).
        allow_network: keep the host network (no network namespace).
        use_namespaces: isolate with the best of bubblewrap/unshare that works (``False``: limits only).
        isolation: force one (``ValueError`` when it does not work here); default: the best.
        tmp_bytes: size of the command's own ``/tmp`` (bubblewrap; a tmpfs, in memory).
    """

    def __init__(self, *, timeout_s: float = 20.0, max_output_bytes: int = 64_000, cpu_s: int = 10,
                 memory_bytes: int = 1 << 30, allow_network: bool = False, use_namespaces: bool = True,
                 isolation: Isolation | None = None, max_processes: int = 128, tmp_bytes: int = 256 << 20) -> None:
        self.timeout_s = timeout_s
        self.tmp_bytes = tmp_bytes
        self.max_output_bytes = max_output_bytes
        self.cpu_s = cpu_s
        self.memory_bytes = memory_bytes
        self.allow_network = allow_network
        self.process_cap = ProcessCap(max_processes)
        if isolation is not None and (why := probe(isolation)) is not None:
            raise ValueError(f"shell isolation {isolation!r} does not work on this host: {why}")
        self.isolation: Isolation = isolation or best_isolation(use_namespaces)

    def describe_isolation(self) -> str:
        """What the isolation in effect hides, in words (``gateway doctor``)."""
        net = "network allowed" if self.allow_network else "no network"
        if self.isolation == "bubblewrap":
            return (f"bubblewrap: the command sees only its workspace (system directories read-only), {net}, "
                    "own PID namespace")
        if self.isolation == "namespaces":
            return (f"namespaces (unshare): {net}, own PID namespace; the host file system is NOT hidden "
                    "(install bubblewrap)")
        return ("none: limits only; the host file system, network and processes are NOT hidden "
                "(install bubblewrap)")

    def describe(self) -> str:
        """One line for ``gateway doctor``: isolation and limits."""
        return (f"{self.describe_isolation()}; timeout {self.timeout_s:g} s, cpu {self.cpu_s} s, "
                f"memory {self.memory_bytes >> 20} MiB, output {self.max_output_bytes} bytes"
                + (f", /tmp {self.tmp_bytes >> 20} MiB" if self.isolation == "bubblewrap" else "") + "; "
                f"{self.process_cap.describe()}")

    def _limits(self, file_bytes: int) -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    def run(self, command: str, cwd: Path, max_disk_bytes: int | None = None) -> ShellResult:
        """Runs ``command`` with ``/bin/sh -c`` in ``cwd``; never raises for the command's faults.
        ``max_disk_bytes``: the command is killed once ``cwd`` takes more (``agent.disk_quota``)."""
        argv = ["/bin/sh", "-c", command]
        if self.isolation == "bubblewrap":
            argv = [*_bwrap_prefix(cwd.resolve(), self.allow_network, self.tmp_bytes), *argv]
        elif self.isolation == "namespaces":
            flags = "-r" if self.allow_network else "-rn"
            argv = ["unshare", flags, "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(cwd), "TMPDIR": str(cwd), "LANG": "C.UTF-8"}
        slot = self.process_cap.prepare()
        try:
            return self._run(argv, cwd, env, slot, DiskWatch(cwd, max_disk_bytes) if max_disk_bytes else None)
        finally:
            self.process_cap.release(slot)

    def _run(self, argv: list[str], cwd: Path, env: dict[str, str], slot: Path | int | None,
             disk: DiskWatch | None) -> ShellResult:
        file_bytes = min(MAX_FILE_BYTES, disk.limit) if disk is not None else MAX_FILE_BYTES

        def before_exec() -> None:  # runs in the child between fork and exec
            self._limits(file_bytes)
            ProcessCap.join(slot)

        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=before_exec)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        chunks: list[bytes] = []
        size, timed_out, truncated, disk_full = 0, False, False, False
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                chunk = proc.stdout.read(65536)
            except BlockingIOError:
                chunk = None
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
                if size > self.max_output_bytes:
                    truncated = True
                    break
                continue
            if chunk == b"" and proc.poll() is not None:
                break
            now = time.monotonic()
            if now > deadline:
                timed_out = True
                break
            if disk is not None and disk.over(now):
                disk_full = True
                break
            time.sleep(0.02)
        killed = timed_out or truncated or disk_full
        if killed:
            self._kill(proc)
        exit_code = proc.wait(5) if not killed else None
        proc.stdout.close()
        if disk is not None and not disk_full and disk.over(force=True):  # what it left behind
            disk_full = True
        output = b"".join(chunks)[: self.max_output_bytes].decode("utf-8", errors="replace")
        return ShellResult(exit_code, cap_text(output, self.max_output_bytes), timed_out, truncated,
                           disk.limit if disk is not None and disk_full else None)

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
