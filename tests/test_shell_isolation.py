"""``run_shell`` never runs unisolated by accident: where neither bubblewrap nor ``unshare`` can
create namespaces (Docker's default seccomp profile forbids the user namespaces both need), a
gateway with ``tools.workspace = "shell"`` refuses to start, one line naming the setting and both
causes, and ``gateway doctor`` fails. Before, the sandbox fell back to "limits only" silently and a
command could read the gateway's secrets from ``/proc/$PPID/environ``. Limits only is still there
for an operator who says so (``tools.shell_isolation = "none"``): ``doctor`` then warns.

The host's failure is reproduced by ``bwrap`` and ``unshare`` stand-ins first on ``PATH`` that fail
with the real programs' messages (a container without user namespaces)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.sandbox import Sandbox, probe
from tests.test_startup_errors import ROOT, run_gateway, toml

BWRAP_ERROR = ("bwrap: No permissions to create a new namespace, likely because the kernel does not allow "
               "non-privileged user namespaces.")
UNSHARE_ERROR = "unshare: unshare failed: Operation not permitted"


@pytest.fixture
def no_namespaces(tmp_path, monkeypatch) -> str:
    """A ``PATH`` whose ``bwrap`` and ``unshare`` fail as in a container without user namespaces
    (also set on this process, the probe's cache cleared before and after)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, message in (("bwrap", BWRAP_ERROR), ("unshare", UNSHARE_ERROR)):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 1\n")
        script.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    monkeypatch.setenv("PATH", path)
    probe.cache_clear()
    yield path
    probe.cache_clear()


def shell_toml(tmp_path: Path, name: str, isolation: str | None = None) -> Path:
    """``toml``'s config (SQLite, port 0, no browser) with a shell workspace."""
    path = toml(tmp_path, name, "")
    extra = f'workspace = "shell"\nworkspace_root = "{tmp_path / "ws"}"\n'
    if isolation is not None:
        extra += f'shell_isolation = "{isolation}"\n'
    path.write_text(path.read_text().replace("[tools]\n", "[tools]\n" + extra))
    return path


def test_the_probe_tells_why_an_isolation_does_not_work(no_namespaces):
    assert probe("bubblewrap") == BWRAP_ERROR
    assert probe("namespaces") == UNSHARE_ERROR
    assert probe("none") is None
    assert Sandbox().isolation == "none"  # the runner itself: the gateway decides what to do with it
    with pytest.raises(ValueError, match="'bubblewrap' does not work on this host: bwrap: No permissions"):
        Sandbox(isolation="bubblewrap")


@pytest.mark.parametrize(("isolation", "expected"), [
    (None, 'error: tools.workspace = "shell" needs bubblewrap or unshare to isolate commands, and neither works '
           f"on this host (bubblewrap: {BWRAP_ERROR}; unshare: {UNSHARE_ERROR}). Install bubblewrap"),
    ("bubblewrap", 'error: tools.shell_isolation = "bubblewrap": shell isolation \'bubblewrap\' does not work on '
                   f"this host: {BWRAP_ERROR}"),
])
def test_a_shell_workspace_without_isolation_refuses_to_start(tmp_path, no_namespaces, isolation, expected):
    result = run_gateway(shell_toml(tmp_path, "shell", isolation), {"PATH": no_namespaces})
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(expected), lines[-1]
    if isolation is None:
        assert lines[-1].endswith('set tools.shell_isolation = "none" to run commands with limits only: they would '
                                  "then see the host's files, processes and network, the gateway's own included")
    assert "Traceback" not in result.stderr


def doctor(config: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY__", "PYTEST"))}
    env.update(PATH=path, PYTHONPATH=str(ROOT), NO_PROXY="127.0.0.1,localhost")
    return subprocess.run([sys.executable, "-m", "gateway", "doctor", "--config", str(config)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_doctor_fails_without_isolation_and_warns_when_the_operator_chose_none(tmp_path, no_namespaces):
    refused = doctor(shell_toml(tmp_path, "best"), no_namespaces)
    assert refused.returncode == 1
    lines = [line for line in refused.stdout.splitlines() if "shell isolation" in line]
    assert len(lines) == 1 and lines[0].startswith('[FAIL] shell isolation: tools.workspace = "shell" needs '), lines

    chosen = doctor(shell_toml(tmp_path, "none", "none"), no_namespaces)
    lines = [line for line in chosen.stdout.splitlines() if "shell isolation" in line]
    assert lines == ["[warn] shell isolation: none: limits only; the host file system, network and processes are "
                     "NOT hidden (install bubblewrap)"], chosen.stdout
    assert any(line.startswith("[ok] workspace: shell in ") for line in chosen.stdout.splitlines())
