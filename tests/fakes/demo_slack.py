"""A gateway against loopback fakes of Slack and of an OpenAI-compatible model, to try the Slack
adapter without a workspace: ``python -m tests.fakes.demo_slack [--channel]``.

Each line you type is posted to the gateway's ``/slack/events`` as a signed Events API event from
"Alice": a DM by default; with ``--channel`` the first line is an ``@mention`` in #general and
every later line a reply in the thread it started (no mention needed there). The real slack-bolt
inside the gateway checks the signature, the agent calls the fake model, and what the gateway
posts with ``chat.postMessage`` (mrkdwn, in the thread) is printed. ``--fakes-only`` starts just
the fakes and prints the environment for a separately started ``make run`` (HTTP port 8080);
``--say TEXT`` sends one line and exits. A line starting with ``/`` (``/status``, ``/new``) is a
slash command, answered ephemerally.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

from tests.fakes.demo import demo_model, read_line
from tests.fakes.openai import FakeOpenAI
from tests.fakes.slack import FakeSlack

DM, CHANNEL, ALICE = "D0ALICE001", "C0GENERAL1", "U0ALICE001"


def environment(slack: FakeSlack, model: FakeOpenAI) -> dict[str, str]:
    return {
        "GATEWAY__SLACK__ENABLED": "true",
        "GATEWAY__SLACK__API_URL": f"{slack.url}/api/",
        "SLACK_BOT_TOKEN": slack.bot_token,
        "SLACK_SIGNING_SECRET": slack.signing_secret,
        "GATEWAY__LLM__BASE_URL": f"{model.url}/v1",
        "OPENAI_API_KEY": "sk-test",
        "GATEWAY__TOOLS__WEB_FETCH_ALLOW_PRIVATE": "true",
        "GATEWAY__DATABASE__URL": "sqlite:///./data/demo-slack.db",
        "GATEWAY__HTTP__PORT": os.environ.get("GATEWAY__HTTP__PORT", "8080"),  # yours wins
    }


class Conversation:
    """Turns typed lines into Slack events: DMs, or a channel mention followed by thread replies."""

    def __init__(self, in_channel: bool) -> None:
        self.in_channel = in_channel
        self.thread_ts: str | None = None

    def event(self, text: str) -> dict[str, Any]:
        ts = f"{time.time():.6f}"
        if not self.in_channel:
            return {"type": "message", "channel_type": "im", "channel": DM, "user": ALICE, "text": text, "ts": ts}
        if self.thread_ts is None:
            self.thread_ts = ts
            return {"type": "app_mention", "channel": CHANNEL, "user": ALICE, "text": f"<@U0BOT00001> {text}", "ts": ts}
        return {"type": "message", "channel_type": "channel", "channel": CHANNEL, "user": ALICE, "text": text,
                "ts": ts, "thread_ts": self.thread_ts}


async def slash_command(slack: FakeSlack, url: str, line: str, channel: str) -> None:
    """A line starting with ``/`` is typed into Slack's message box: a signed slash command; the
    ephemeral answer (only Alice sees it) is printed."""
    command, _, text = line.partition(" ")
    shown = len(slack.ephemeral)
    delivery = await slack.post_command(url, slack.command_payload(command, text, channel=channel), timeout=3)
    if delivery.status != 200 or delivery.body:
        print(f"(Slack shows: HTTP {delivery.status} {delivery.body})")
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(slack.ephemeral) == shown:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    for answer in slack.ephemeral[shown:]:
        print(f"bot>   [only visible to you, #{answer['channel']}] {answer['text']}")


async def converse(slack: FakeSlack, url: str, in_channel: bool, lines: list[str] | None) -> None:
    loop = asyncio.get_running_loop()
    talk = Conversation(in_channel)
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
        if line.startswith("/"):
            await slash_command(slack, url, line, CHANNEL if in_channel else DM)
            continue
        before = len(slack.calls("chat.postMessage"))
        delivery = await slack.post_event(url, talk.event(line))
        if delivery.status != 200:
            print(f"(gateway answered HTTP {delivery.status}: {delivery.body})")
            continue
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(slack.calls("chat.postMessage")) == before:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # long replies arrive in several messages
        for call in slack.calls("chat.postMessage")[before:]:
            thread = call.params.get("thread_ts")
            where = f"#{call.params['channel']}" + (f" thread {thread}" if thread else "")
            print(f"bot>   [{where}] {call.params['text']}")


async def main_async(args: argparse.Namespace) -> None:
    from gateway.app.gateway import Gateway
    from gateway.app.wiring import build_adapters
    from gateway.core.config import load_config
    from gateway.ops.logs import setup_logging

    with FakeSlack() as slack, FakeOpenAI(api_key="sk-test") as model:
        model.responder = demo_model
        env = environment(slack, model)
        if args.fakes_only:
            print("Fakes are running. Start the gateway in another shell with:\n")
            print("  " + " \\\n  ".join(f"{k}={v}" for k, v in env.items()) + " \\\n  make run\n")
            print("Then type lines here; they are posted to http://127.0.0.1:8080/slack/events (Ctrl-C to stop).")
            try:
                await converse(slack, "http://127.0.0.1:8080/slack/events", args.channel, None)
            except (EOFError, KeyboardInterrupt):
                return
            return
        os.environ.update(env)
        config = load_config(None, http={"port": 0})
        setup_logging(os.environ.get("DEMO_LOG", "WARNING"), ["sk-test", slack.bot_token, slack.signing_secret])
        gateway = Gateway(config, build_adapters(config))
        await gateway.start()
        url = f"http://127.0.0.1:{gateway.http_port}/slack/events"
        print(f"Gateway running against fakes (Slack {slack.url}, model {model.url}); events: {url}. "
              f"Type a message, Ctrl-D to quit.")
        try:
            await converse(slack, url, args.channel, [args.say] if args.say else None)
        except (EOFError, KeyboardInterrupt):
            pass
        finally:
            await gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channel", action="store_true", help="mention the bot in #general, then talk in the thread")
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
