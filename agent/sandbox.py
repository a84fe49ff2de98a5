"""Runs one shell command for ``run_shell`` with limits (issue 9).

What is enforced:
  * wall-clock timeout: the whole process group (and, with namespaces, the whole PID namespace)
    is killed;
  * output cap: stdout+stderr beyond ``max_output_bytes`` is not read; the command is killed;
  * resource limits (``setrlimit``): CPU seconds, address space, file size, open files;
  * a scrubbed environment: only ``PATH``, ``HOME`` (the workspace), ``LANG``, ``TMPDIR`` —
    no secrets from the gateway's environment;
  * ``mechanism == "unshare"`` (util-linux ``unshare`` works on this host): new user, network and
    PID namespaces: no network at all (only a down loopback) unless ``allow_network``, and the
    command cannot see or signal the gateway's processes.

What is NOT enforced: the file system is the host's (the working directory is the workspace,
but an absolute path like ``/etc/hosts`` is readable with the gateway user's rights, and
writable where that user may write); there is no seccomp filter. Run the gateway as an
unprivileged user, or in a container, when shell access is on. ``mechanism == "rlimits"`` (no
usable ``unshare``) adds no network or process isolation at all.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from agent.execute import cap_text


@dataclass(frozen=True)
class ShellResult:
    """``exit_code`` (``None`` when killed), combined output, and why it was cut short."""

    exit_code: int | None
    output: str
    timed_out: bool = False
    truncated: bool = False

    def describe(self) -> str:
        """The text the model reads."""
        notes = []
        if self.timed_out:
            notes.append("killed: time limit reached")
        if self.truncated:
            notes.append("killed: output limit reached")
        head = f"exit code: {self.exit_code if self.exit_code is not None else 'none'}"
        if notes:
            head += f" ({'; '.join(notes)})"
        return f"{head}\n{self.output}"


def _unshare_works() -> bool:
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        done = subprocess.run([exe, "-rn", "--pid", "--fork", "--kill-child", "true"], capture_output=True,
                              timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


class Sandbox:
    """Shell runner. ``mechanism`` says what is active (``unshare`` or ``rlimits``).

    Args:
        timeout_s: wall-clock limit per command.
        max_output_bytes: output read before the command is killed.
        cpu_s: CPU seconds (RLIMIT_CPU).
        memory_bytes: address space (RLIMIT_AS).
        allow_network: keep the host network (no network namespace).
        use_namespaces: try ``unshare`` (``False``: rlimits only).
    """

    def __init__(self, *, timeout_s: float = 20.0, max_output_bytes: int = 64_000, cpu_s: int = 10,
                 memory_bytes: int = 1 << 30, allow_network: bool = False, use_namespaces: bool = True) -> None:
        self.timeout_s = timeout_s
        self.max_output_bytes = max_output_bytes
        self.cpu_s = cpu_s
        self.memory_bytes = memory_bytes
        self.allow_network = allow_network
        self.mechanism = "unshare" if use_namespaces and _unshare_works() else "rlimits"

    def describe(self) -> str:
        """One line for ``gateway doctor``."""
        net = "network allowed" if self.allow_network else (
            "no network" if self.mechanism == "unshare" else "network NOT blocked (no unshare)")
        return (f"{self.mechanism}: timeout {self.timeout_s:g} s, cpu {self.cpu_s} s, "
                f"memory {self.memory_bytes >> 20} MiB, output {self.max_output_bytes} bytes, {net}")

    def _limits(self) -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_s, self.cpu_s))
        resource.setrlimit(resource.RLIMIT_AS, (self.memory_bytes, self.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (100 << 20, 100 << 20))
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    def run(self, command: str, cwd: Path) -> ShellResult:
        """Runs ``command`` with ``/bin/sh -c`` in ``cwd``; never raises for the command's faults."""
        argv = ["/bin/sh", "-c", command]
        if self.mechanism == "unshare":
            flags = "-r" if self.allow_network else "-rn"
            argv = ["unshare", flags, "--pid", "--fork", "--kill-child", "--mount-proc", *argv]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(cwd), "TMPDIR": str(cwd), "LANG": "C.UTF-8"}
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=self._limits)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        chunks: list[bytes] = []
        size, timed_out, truncated = 0, False, False
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
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(0.02)
        if timed_out or truncated:
            self._kill(proc)
        exit_code = proc.wait(5) if not (timed_out or truncated) else None
        proc.stdout.close()
        output = b"".join(chunks)[: self.max_output_bytes].decode("utf-8", errors="replace")
        return ShellResult(exit_code, cap_text(output, self.max_output_bytes), timed_out, truncated)

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
