"""Approvals on a second platform: Slack Block Kit buttons through the real slack-bolt and
slack-sdk against the loopback fake. The requester's press approves and the tool runs; a
stranger's press is refused; a deny tells the model."""

from __future__ import annotations

import json

from tests.conftest import gateway_config, start_gateway
from tests.fakes.slack import post_interaction
from tests.helpers import wait_until
from tests.test_approvals_e2e import write_then_report
from tests.test_slack_e2e import events_url, message

DM = "D0APPROVE1"
OWNER, STRANGER = "U0OWNER001", "U0STRANGE1"


def posted(fake, channel: str) -> list:
    return [c for c in fake.calls("chat.postMessage") if c.params["channel"] == channel]


def blocks_of(call) -> list[dict]:
    blocks = call.params.get("blocks")
    return json.loads(blocks) if isinstance(blocks, str) else (blocks or [])


def press(channel: str, user: str, value: str, ts: str, action_ts: str) -> dict:
    """A ``block_actions`` payload as Slack sends it for a pressed button."""
    return {"type": "block_actions", "user": {"id": user, "name": user.lower()}, "team": {"id": "T0FAKE0001"},
            "channel": {"id": channel}, "container": {"type": "message", "channel_id": channel, "message_ts": ts},
            "message": {"ts": ts, "text": "Approval needed"},
            "actions": [{"type": "button", "action_id": "gw_cmd_0", "value": value, "action_ts": action_ts}]}


async def prompt(fake, channel: str):
    await wait_until(lambda: any("Approval needed" in c.params["text"] for c in posted(fake, channel)),
                     what="approval prompt")
    return next(c for c in posted(fake, channel) if "Approval needed" in c.params["text"])


def config(tmp_path, fake_openai, fake_slack):
    return gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, access={"allowed_users": [f"slack:{OWNER}"]},
                          tools={"workspace": "write", "workspace_root": str(tmp_path / "ws")},
                          approvals={"require_for": ["write", "external"], "timeout_s": 10.0})


async def test_slack_buttons_approve_and_a_strangers_press_is_refused(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = write_then_report
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_slack), running)
    url = events_url(gateway)
    assert (await fake_slack.post_event(url, message("make a plan", "1810000000.000100", channel=DM,
                                                     user=OWNER))).status == 200
    call = await prompt(fake_slack, DM)
    actions = next(b for b in blocks_of(call) if b["type"] == "actions")
    values = [(e["text"]["text"], e["value"]) for e in actions["elements"]]
    assert values[0][1].startswith("/approve ") and values[1][1].startswith("/deny ")
    approve = values[0][1]

    delivery = await post_interaction(fake_slack, url, press(DM, STRANGER, approve, call.params.get("ts", "1"), "1.1"))
    assert delivery.status == 200
    await wait_until(lambda: any("Only the person" in c.params["text"] for c in posted(fake_slack, DM)),
                     what="stranger refused")
    assert not list((tmp_path / "ws").rglob("plan.txt"))

    assert (await post_interaction(fake_slack, url, press(DM, OWNER, approve, "1", "1.2"))).status == 200
    await wait_until(lambda: any(c.params["text"].startswith("tool said") for c in posted(fake_slack, DM)),
                     what="turn finished")
    assert posted(fake_slack, DM)[-1].params["text"] == "tool said: Wrote 6 bytes to plan.txt."
    assert list((tmp_path / "ws").rglob("plan.txt"))


async def test_slack_deny_button_tells_the_model_and_nothing_runs(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = write_then_report
    channel = "D0APPROVE2"
    gateway = await start_gateway(config(tmp_path, fake_openai, fake_slack), running)
    url = events_url(gateway)
    assert (await fake_slack.post_event(url, message("make a plan", "1810000001.000100", channel=channel,
                                                     user=OWNER))).status == 200
    call = await prompt(fake_slack, channel)
    deny = next(e["value"] for b in blocks_of(call) if b["type"] == "actions" for e in b["elements"]
                if e["value"].startswith("/deny "))
    assert (await post_interaction(fake_slack, url, press(channel, OWNER, deny, "1", "2.1"))).status == 200
    await wait_until(lambda: any(c.params["text"].startswith("tool said") for c in posted(fake_slack, channel)),
                     what="turn finished")
    assert "denied" in posted(fake_slack, channel)[-1].params["text"].lower()
    assert not list((tmp_path / "ws").rglob("plan.txt"))
