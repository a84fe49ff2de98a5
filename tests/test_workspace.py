"""Workspace tools: confinement (traversal, symlinks) and the shell sandbox (timeout, output cap,
fork bomb, no secrets, no network)."""

from __future__ import annotations

import os
import time

import pytest

from agent.context import RunContext
from agent.sandbox import Sandbox
from agent.workspace import Workspace, WorkspaceError


@pytest.fixture
def ws(tmp_path):
    return Workspace(tmp_path / "ws", "shell", sandbox=Sandbox(timeout_s=2, max_output_bytes=10_000, cpu_s=5))


CTX = RunContext(session_id="sess-1")


def test_the_ladder_offers_tools_by_permission(tmp_path):
    names = {p: [t.name for t in Workspace(tmp_path, p).tools()] for p in ("read", "write", "shell")}
    assert names == {"read": ["list_files", "read_file"], "write": ["list_files", "read_file", "write_file"],
                     "shell": ["list_files", "read_file", "run_shell", "write_file"]}


def test_files_round_trip_inside_the_workspace(ws):
    assert ws.write_file(CTX, "notes/a.txt", "hello") == "Wrote 5 bytes to notes/a.txt."
    assert ws.read_file(CTX, "notes/a.txt") == "hello"
    assert ws.list_files(CTX) == "notes/a.txt (5 bytes)"
    assert ws.read_file(RunContext(session_id="sess-2"), "notes/a.txt").startswith("Error")  # per session


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "notes/../../sess-2/x", "../"])
def test_traversal_is_refused(ws, path):
    with pytest.raises(WorkspaceError):
        ws.read_file(CTX, path)


def test_symlinks_out_of_the_workspace_are_refused(ws, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("top secret")
    base = ws.directory("sess-1")
    os.symlink(outside, base / "link.txt")
    os.symlink(tmp_path, base / "dirlink")
    with pytest.raises(WorkspaceError):
        ws.read_file(CTX, "link.txt")
    with pytest.raises(WorkspaceError):
        ws.write_file(CTX, "dirlink/new.txt", "x")
    with pytest.raises(WorkspaceError):
        ws.list_files(CTX, "dirlink")
    assert outside.read_text() == "top secret"


def test_shell_runs_in_the_workspace_with_a_scrubbed_environment(ws, monkeypatch):
    monkeypatch.setenv("GATEWAY_SUPER_SECRET", "do-not-leak-me")
    out = ws.run_shell(CTX, "pwd; env; cat ~/.ssh/* 2>&1; echo done")
    assert out.startswith("exit code: 0")
    assert str(ws.directory("sess-1")) in out and "done" in out
    assert "do-not-leak-me" not in out and "No such file" in out


def test_shell_timeout_kills_an_infinite_loop(ws):
    started = time.monotonic()
    out = ws.run_shell(CTX, "while true; do :; done")
    assert "killed: time limit reached" in out
    assert time.monotonic() - started < 5


def test_shell_output_is_capped(ws):
    started = time.monotonic()
    out = ws.run_shell(CTX, "head -c 100000000 /dev/zero | tr '\\0' x")
    assert "killed: output limit reached" in out and len(out) < 11_000
    assert time.monotonic() - started < 5


def test_fork_bomb_is_contained(ws):
    started = time.monotonic()
    out = ws.run_shell(CTX, "bomb() { bomb | bomb & }; bomb")
    assert time.monotonic() - started < 6
    assert "exit code" in out
    assert ws.run_shell(CTX, "echo still fine").startswith("exit code: 0\nstill fine")


def test_no_network_by_default_when_namespaces_work(ws):
    if ws.sandbox.mechanism != "unshare":
        pytest.skip("unshare is not usable here: network isolation is off (documented)")
    out = ws.run_shell(CTX, "cat /proc/net/dev | tail -n +3 | cut -d: -f1; ps ax | wc -l")
    assert out.split("\n")[1].strip() == "lo"  # only a loopback interface
