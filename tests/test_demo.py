"""``make demo`` (tests/fakes/demo.py) as a user runs it, with piped input: the output is the
banner and the conversation, nothing else (no warning, no traceback), and the fake model answers
the memory proposal in its JSON schema, so what the user said about themselves is remembered."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_prints_the_conversation_and_nothing_else(tmp_path, page_server):
    lines = ["hello there", "my favourite colour is teal, keep that in mind please",
             f"what does {page_server.url}/page say?", "/help"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATEWAY__HTTP__PORT": "0"}
    env.pop("DEMO_LOG", None)
    done = subprocess.run([sys.executable, "-m", "tests.fakes.demo"], input="\n".join(lines) + "\n", cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    out = done.stdout.splitlines()
    assert re.fullmatch(r"Gateway running against fakes \(Telegram http://127\.0\.0\.1:\d+, model "
                        r"http://127\.0\.0\.1:\d+\); health: http://127\.0\.0\.1:\d+/healthz\. "
                        r"Type a message, Ctrl-D to quit\.", out[0])
    assert out[1:14] == [
        "alice> hello there",
        "bot>   You said: hello there",
        f"alice> {lines[1]}",
        f"bot>   You said: {lines[1]}",
        f"alice> {lines[2]}",
        "bot>   Here is what I found:",
        "",
        "⦁ URL: " + page_server.url + "/page",
        "⦁ Status: 200",
        "⦁ Title: Release notes",
        "⦁ Release 2.0",
        "⦁ The release ships the durable inbox.",
        "⦁ Codename: amber-falcon-42.",
    ]
    assert out[14:16] == ["alice> /help", "bot>   I am an AI assistant. Write to me in a DM, or mention me (or reply "
                                           "to me) in a group."]  # a command, as Telegram's apps send it
    with sqlite3.connect(tmp_path / "data" / "demo.db") as db:
        assert db.execute("SELECT type, text FROM memories").fetchall() == [
            ("fact", "My favourite colour is teal, keep that in mind please")]


def test_the_fakes_alone_keep_running_without_a_terminal_and_a_second_demo_says_why_it_cannot(tmp_path):
    """``--fakes-only`` from a script (stdin at its end) keeps serving until stopped; a ``make demo``
    beside a gateway already on ``./data/demo.db`` ends with one line, not a traceback."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GATEWAY__HTTP__PORT": "0"}
    fakes = subprocess.Popen([sys.executable, "-m", "tests.fakes.demo", "--fakes-only"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        assert fakes.stdout is not None
        seen = []
        for line in fakes.stdout:
            seen.append(line)
            if line.startswith("No more input"):
                break
        assert any("make run" in line for line in seen)
        gateway_env = {**env, **dict(re.findall(r"^\s+(\w+)=(\S+) \\$", "".join(seen), re.M))}
        assert gateway_env["GATEWAY__DATABASE__URL"] == "sqlite:///./data/demo.db"
        first = subprocess.Popen([sys.executable, "-m", "gateway", "run"], cwd=tmp_path, env=gateway_env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 30
            while not (tmp_path / "data" / "demo.db").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(2)  # its instance id is taken
            assert fakes.poll() is None and first.poll() is None  # the fakes outlived their input
            second = subprocess.run([sys.executable, "-m", "tests.fakes.demo", "--say", "hi"], cwd=tmp_path,
                                    env=env, capture_output=True, text=True, timeout=60)
        finally:
            first.terminate()
            first.wait(20)
        assert second.returncode == 2
        assert second.stderr.startswith("error: ") and len(second.stderr.strip().splitlines()) == 1
        assert "Traceback" not in second.stderr
    finally:
        fakes.terminate()
        fakes.wait(20)
