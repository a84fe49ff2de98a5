"""A gateway against loopback fakes of Telegram and of an OpenAI-compatible model, to try it
without any account: ``make demo`` (or ``python -m tests.fakes.demo``).

Each line you type is sent as a Telegram DM from "Alice" into the fake Bot API; the real
python-telegram-bot inside the gateway receives it, the agent calls the fake model (which asks
for ``web_fetch`` when your line contains a URL), and the reply the gateway sends to the fake Bot
API is printed. ``--fakes-only`` starts just the fakes and prints the environment to point a
separately started ``make run`` at them. ``--say TEXT`` sends one line and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from typing import Any

from gateway.memory.promote import PROPOSE_PROMPT
from tests.fakes import openai as oa
from tests.fakes.openai import FakeOpenAI
from tests.fakes.telegram import FakeTelegram

TOKEN = "7000000001:AAFakeTokenForLoopbackTestsOnly0000"
URL = re.compile(r"https?://\S+")


_ABOUT_ME = re.compile(r"^\[m(\d+) user\] ((?:my|i am|i'm|i live|i work)\b.{3,200})$", re.IGNORECASE | re.MULTILINE)


def demo_model(request: dict[str, Any]) -> oa.Reply:
    """A tiny scripted "model": fetches URLs it is given, then quotes the page; else echoes.

    The long-term memory's proposal call (after a turn) is answered in its JSON schema, as a real
    model does: a user line about themselves ("my ...", "I am ...") becomes a ``fact`` citing that
    message, anything else ``{"memories": []}``.
    """
    if request["messages"][0].get("content") == PROPOSE_PROMPT:
        memories = [{"text": text[0].upper() + text[1:].strip().rstrip("."), "type": "fact",
                     "evidence": [int(mid)], "confidence": 0.8, "supersedes": []}
                    for mid, text in _ABOUT_ME.findall(request["messages"][-1]["content"])]
        return oa.text(json.dumps({"memories": memories}))
    last = request["messages"][-1]
    if last["role"] == "tool":
        # The page's lines only: not the untrusted-output wrapper or the budget note around them.
        lines = [line for line in last["content"].splitlines()
                 if line.strip() and not line.startswith(("<tool_output", "</tool_output", "[budget"))]
        return oa.text("Here is what I found:\n\n" + "\n".join(f"- {line}" for line in lines[:6]))
    found = URL.search(last.get("content") or "")
    if found:
        return oa.tool_calls(oa.call("web_fetch", {"url": found.group(0)}))
    text = (last.get("content") or "").splitlines()[-1]
    return oa.text(f"You said: **{text}**")


def environment(telegram: FakeTelegram, model: FakeOpenAI) -> dict[str, str]:
    return {
        "GATEWAY__TELEGRAM__ENABLED": "true",
        "GATEWAY__TELEGRAM__BASE_URL": telegram.url,
        "GATEWAY__TELEGRAM__POLL_TIMEOUT_S": "5",
        "TELEGRAM_BOT_TOKEN": TOKEN,
        "GATEWAY__LLM__BASE_URL": f"{model.url}/v1",
        "OPENAI_API_KEY": "sk-test",
        "GATEWAY__TOOLS__WEB_FETCH_ALLOW_PRIVATE": "true",
        "GATEWAY__DATABASE__URL": "sqlite:///./data/demo.db",
        "GATEWAY__HTTP__PORT": os.environ.get("GATEWAY__HTTP__PORT", "8080"),  # yours wins
    }


def dm(text: str, message_id: int) -> dict[str, Any]:
    user = {"id": 5550001, "is_bot": False, "first_name": "Alice", "username": "alice_example"}
    chat = {"id": 5550001, "first_name": "Alice", "type": "private"}
    message: dict[str, Any] = {"message_id": message_id, "from": user, "chat": chat, "date": int(time.time()),
                               "text": text}
    if text.startswith("/"):  # as Telegram's clients send a command: a bot_command entity over it
        message["entities"] = [{"type": "bot_command", "offset": 0, "length": len(text.split()[0])}]
    return {"message": message}


def read_line(prompt: str = "alice> ") -> str:
    """The next typed line (``EOFError`` at the end). Piped input is echoed after the prompt, so
    the output reads as the conversation."""
    if sys.stdin.isatty():
        return input(prompt)
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    line = line.rstrip("\n")
    print(f"{prompt}{line}", flush=True)
    return line


async def converse(telegram: FakeTelegram, lines: list[str] | None) -> None:
    loop = asyncio.get_running_loop()
    message_id = int(time.time())
    while True:
        if lines is None:
            line = await loop.run_in_executor(None, read_line)
        elif lines:
            line = lines.pop(0)
            print(f"alice> {line}")
        else:
            return
        if not line.strip():
            continue
        before = len(telegram.calls("sendMessage"))
        message_id += 1000
        telegram.inject(dm(line, message_id))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(telegram.calls("sendMessage")) == before:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # long replies arrive in several messages
        for call in telegram.calls("sendMessage")[before:]:
            print(f"bot>   {call.params['text']}", flush=True)


async def main_async(args: argparse.Namespace) -> None:
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters
    from gateway.core.config import load_config
    from gateway.core.errors import ConfigError
    from gateway.ops.logs import setup_logging

    with FakeTelegram(token=TOKEN) as telegram, FakeOpenAI(api_key="sk-test") as model:
        model.responder = demo_model
        telegram.can_read_all_group_messages = True  # this fake hides no group message: no privacy warning
        env = environment(telegram, model)
        if args.fakes_only:
            print("Fakes are running. Start the gateway in another shell with:\n")
            print("  " + " \\\n  ".join(f"{k}={v}" for k, v in env.items()) + " \\\n  make run\n")
            print("Then type lines here to send them as Telegram DMs (Ctrl-C to stop).", flush=True)
            try:
                await converse(telegram, None)
            except EOFError:  # no terminal (or Ctrl-D): the fakes keep serving the gateway
                print("No more input; the fakes keep running for the gateway (Ctrl-C to stop).", flush=True)
                await asyncio.Event().wait()
            except KeyboardInterrupt:
                return
            return
        os.environ.update(env)
        config = load_config(None)
        setup_logging(os.environ.get("DEMO_LOG", "WARNING"), ["sk-test", TOKEN])
        gateway = Gateway(config, build_adapters(config))
        try:
            await gateway.start()
        except ConfigError as exc:  # e.g. `make run` on the same demo database: one line, as `gateway run`
            print(f"error: {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        print(f"Gateway running against fakes (Telegram {telegram.url}, model {model.url}); "
              f"health: http://127.0.0.1:{gateway.http_port}/healthz. Type a message, Ctrl-D to quit.")
        try:
            await converse(telegram, [args.say] if args.say else None)
        except (EOFError, KeyboardInterrupt):
            pass
        finally:
            await gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fakes-only", action="store_true", help="start only the fakes; print the gateway env")
    parser.add_argument("--say", help="send one message, print the reply, exit")
    args = parser.parse_args()
    os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
    try:
        asyncio.run(main_async(args))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
