"""``make demo`` (tests/fakes/demo.py) as a user runs it, with piped input: the output is the
banner and the conversation, nothing else (no warning, no traceback), and the fake model answers
the memory proposal in its JSON schema, so what the user said about themselves is remembered."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
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
