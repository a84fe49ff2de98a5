"""Shared pieces of the ``send_file`` tests: pictures made with Pillow, shell commands that write
them into the workspace (as an agent's ``run_shell`` would), and a scripted model that runs a list
of tool calls and then answers."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Callable
from typing import Any

from PIL import Image

from tests.fakes import openai as oa


def png(width: int = 320, height: int = 200, color: str = "teal") -> bytes:
    """A real PNG (what a matplotlib chart written by run_shell would be)."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_with_shell(name: str, data: bytes) -> str:
    """A ``run_shell`` command that writes ``data`` to ``name`` in the workspace."""
    return f"echo {base64.b64encode(data).decode()} | base64 -d > {name} && echo written {name}"


Step = Callable[[], oa.Reply]


def shell(command: str) -> Step:
    return lambda: oa.tool_calls(oa.call("run_shell", {"command": command}))


def send(path: str, caption: str = "") -> Step:
    args = {"path": path, **({"caption": caption} if caption else {})}
    return lambda: oa.tool_calls(oa.call("send_file", args))


def answer(text: str) -> Step:
    return lambda: oa.text(text)


def flow(*steps: Step) -> Callable[[dict[str, Any]], oa.Reply]:
    """A responder: after the newest user message, the n-th request gets ``steps[n]`` (the number
    of tool results since that message says how far the turn is); the last step repeats."""
    def respond(request: dict[str, Any]) -> oa.Reply:
        messages = request["messages"]
        start = max(i for i, m in enumerate(messages) if m["role"] == "user")
        done = sum(1 for m in messages[start:] if m["role"] == "tool")
        return steps[min(done, len(steps) - 1)]()

    return respond


def tool_results(fake_openai, name_hint: str = "") -> list[str]:
    """Every tool result the model was shown (newest request last), deduplicated in order."""
    seen: list[str] = []
    for request in fake_openai.requests:
        for message in request["json"]["messages"]:
            if message["role"] == "tool" and name_hint in message["content"] and message["content"] not in seen:
                seen.append(message["content"])
    return seen
