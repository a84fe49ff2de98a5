"""Slack Socket Mode connections end to end (slack-bolt's AsyncSocketModeHandler against the fake's
``apps.connections.open`` + WebSocket): a server-requested ``disconnect`` and a dropped socket are
followed by a new connection within seconds, and no event is lost on the way (Slack redelivers what
was not acked; the inbox drops a redelivered duplicate)."""

from __future__ import annotations

from tests.conftest import gateway_config, start_gateway
from tests.fakes import openai as oa
from tests.helpers import wait_until

DM = "D0ALICE001"
RECONNECT_WITHIN_S = 15.0  # generous for a loaded machine; the adapter's SDK checks its socket every 5 s


def dm_event(text: str, ts: str) -> dict:
    return {"type": "message", "user": "U0ALICE001", "text": text, "ts": ts, "channel": DM, "channel_type": "im",
            "event_ts": ts, "team": "T0FAKE0001"}


def replies(fake, since: int) -> list[str]:
    return [c.params["text"] for c in fake.calls("chat.postMessage")[since:] if c.params["channel"] == DM]


async def test_disconnect_and_dropped_socket_reconnect_and_lose_nothing(tmp_path, fake_slack, fake_openai, running):
    fake_openai.reset()
    fake_openai.responder = lambda req: oa.text("re: " + req["messages"][-1]["content"].rsplit("\n", 1)[-1])
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, slack={"mode": "socket"})
    gateway = await start_gateway(config, running)
    await wait_until(lambda: fake_slack.socket_clients == 1, what="socket connection")
    since, opened = len(fake_slack.calls("chat.postMessage")), fake_slack.connections_opened
    urls = len(fake_slack.calls("apps.connections.open"))

    first = fake_slack.push(event=dm_event("one", "1735710000.000100"))
    await fake_slack.wait_for_ack(first)
    await wait_until(lambda: replies(fake_slack, since) == ["re: one"], what="first reply")

    # Slack asks for a reconnect (as it does every few hours) right after an event: a new URL, a new
    # socket, the old one closed; the event in flight is answered once whichever socket acked it.
    second = fake_slack.push(event=dm_event("two", "1735710000.000200"))
    fake_slack.disconnect("refresh_requested")
    await wait_until(lambda: fake_slack.connections_opened == opened + 1 and fake_slack.socket_clients == 1,
                     timeout=RECONNECT_WITHIN_S, what="reconnect after disconnect")
    assert len(fake_slack.calls("apps.connections.open")) == urls + 1
    await fake_slack.wait_for_ack(second)
    await wait_until(lambda: replies(fake_slack, since)[-1:] == ["re: two"], what="reply after refresh")

    # The network drops the socket: the client notices, reconnects; an event sent meanwhile arrives.
    fake_slack.drop()
    await wait_until(lambda: fake_slack.socket_clients == 0, what="socket dropped")
    third = fake_slack.push(event=dm_event("three", "1735710000.000300"))  # no connection now: Slack retries
    await wait_until(lambda: fake_slack.connections_opened == opened + 2, timeout=RECONNECT_WITHIN_S,
                     what="reconnect after drop")
    await fake_slack.wait_for_ack(third, timeout=RECONNECT_WITHIN_S)
    await wait_until(lambda: replies(fake_slack, since)[-1:] == ["re: three"], what="reply after drop")

    assert replies(fake_slack, since) == ["re: one", "re: two", "re: three"]  # each once, in order
    assert len(fake_openai.requests) == 3 and gateway.store.count_inbox("done") == 3


async def test_interactions_that_are_not_the_gateways_are_acknowledged(tmp_path, fake_slack, fake_openai, running):
    """A modal's submission and a press of another app's button, over Socket Mode: acknowledged
    (Bolt answered them 404 and never acked, so Slack showed the user an error; over HTTP they got
    200 already). Found by a review."""
    fake_openai.reset()
    config = gateway_config(tmp_path, fake_openai, fake_slack=fake_slack, slack={"mode": "socket"})
    gateway = await start_gateway(config, running)
    await wait_until(lambda: fake_slack.socket_clients == 1, what="socket connection")
    team, user = {"id": fake_slack.team_id}, {"id": "U0ALICE001"}
    submission = fake_slack.push({"envelope_id": "env-view", "type": "interactive", "accepts_response_payload": False,
                                  "payload": {"type": "view_submission", "team": team, "user": user,
                                              "view": {"id": "V1", "type": "modal", "callback_id": "x",
                                                       "state": {"values": {}}}}})
    foreign = fake_slack.push({"envelope_id": "env-foreign", "type": "interactive", "accepts_response_payload": False,
                               "payload": {"type": "block_actions", "team": team, "user": user,
                                           "actions": [{"action_id": "someone_elses_button", "value": "1",
                                                        "type": "button"}]}})
    assert await fake_slack.wait_for_ack(submission) == {"envelope_id": "env-view"}
    assert await fake_slack.wait_for_ack(foreign) == {"envelope_id": "env-foreign"}
    assert sum(gateway.store.count_inbox(s) for s in ("pending", "done", "failed")) == 0
