"""``bench.timeline``'s hook: the functions it marks in a process started with ``hook_env``."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.timeline import ENV, hook_env


def test_extra_functions_are_marked_on_entry_and_exit(tmp_path):
    marks = tmp_path / "marks.json"
    env = {**os.environ, **hook_env(marks), ENV + "_EXTRA": "json:dumps,textwrap:TextWrapper.wrap"}
    script = "import json, textwrap; json.dumps([1]); textwrap.TextWrapper(width=5).wrap('a b c d')"
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    names = [mark for _, mark in json.loads(marks.read_text())]
    assert names.index("dumps>") < names.index("dumps<")
    assert names.index("TextWrapper.wrap>") < names.index("TextWrapper.wrap<")


def test_without_extra_only_the_steps_are_wrapped(tmp_path):
    marks = tmp_path / "marks.json"
    env = {**os.environ, **hook_env(marks)}
    env.pop(ENV + "_EXTRA", None)
    subprocess.run([sys.executable, "-c", "import json; json.dumps([1])"], env=env, check=True, timeout=60)
    assert all(not mark.startswith("dumps") for _, mark in json.loads(marks.read_text()))
