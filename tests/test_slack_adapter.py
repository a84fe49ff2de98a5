"""``SlackAdapter`` outbound and the fake Slack Web API, through the real slack-sdk on loopback:
error mapping for delivery, parts skipped on resume, edits, the signature check, the fake's limits."""

from __future__ import annotations

import time

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack.adapter import SlackAdapter, signature_problem
from gateway.core.errors import CredentialRejected
from gateway.core.types import ChatAddress, OutboundMessage
from tests.fakes.slack import TEXT_LIMIT, FakeSlack, visible_text

DM = ChatAddress("slack", "T0FAKE0001", "D0ALICE001")
THREAD = ChatAddress("slack", "T0FAKE0001", "C0GENERAL1", "1735689660.000200")


@pytest.fixture
def adapter(fake_slack: FakeSlack) -> SlackAdapter:
    return SlackAdapter(bot_token=fake_slack.bot_token, signing_secret=fake_slack.signing_secret,
                        api_url=f"{fake_slack.url}/api/")


def reply(text: str, address: ChatAddress = DM, resume_from: int = 0, fmt: str = "markdown") -> OutboundMessage:
    return OutboundMessage(address, text, idempotency_key="t:0", resume_from=resume_from, format=fmt)  # type: ignore[arg-type]


async def test_send_posts_in_the_thread_and_returns_the_ts(adapter, fake_slack):
    result = await adapter.send(reply("**done**", THREAD))
    assert result.ok and len(result.platform_message_ids) == 1
    posted = fake_slack.posted("C0GENERAL1", THREAD.thread_id)[-1]
    assert posted["ts"] == result.platform_message_ids[0] and posted["text"] == "*done*"


async def test_resume_skips_parts_already_delivered(adapter, fake_slack):
    text = "\n\n".join(f"paragraph {i} " + "x" * 1500 for i in range(6))
    since = len(fake_slack.calls("chat.postMessage"))
    reported: list[str] = []

    async def on_part(ts: str) -> None:
        reported.append(ts)

    full = await adapter.send(reply(text), on_part)
    assert full.ok and len(full.platform_message_ids) == 3
    assert reported == list(full.platform_message_ids[:2])  # each part but the last, as it is sent
    resumed = await adapter.send(reply(text, resume_from=2))
    calls = fake_slack.calls("chat.postMessage")[since:]
    assert resumed.ok and len(resumed.platform_message_ids) == 1
    assert calls[-1].params["text"] == calls[2].params["text"]  # only the last part again


async def test_rate_limit_is_retryable_with_retry_after(adapter, fake_slack):
    fake_slack.fail_next("chat.postMessage", "ratelimited", retry_after=7)
    result = await adapter.send(reply("hello"))
    assert (result.ok, result.retryable, result.retry_after) == (False, True, 7.0)


async def test_server_error_is_retryable_and_other_errors_are_permanent(adapter, fake_slack):
    fake_slack.fail_next("chat.postMessage", "internal_error", status=500)
    result = await adapter.send(reply("hello"))
    assert not result.ok and result.retryable and result.retry_after is None
    gone = await adapter.send(reply("hello", ChatAddress("slack", "T0FAKE0001", "C0UNKNOWN1")))
    assert (gone.ok, gone.retryable, gone.error) == (False, False, "slack error: channel_not_found")


async def test_a_failure_midway_reports_the_parts_sent(adapter, fake_slack):
    text = "\n\n".join(f"part {i} " + "y" * 2000 for i in range(3))
    since = len(fake_slack.calls("chat.postMessage"))
    fake_slack.fail_next("chat.postMessage", "ratelimited", retry_after=1, after=1)
    result = await adapter.send(reply(text))
    assert not result.ok and result.retryable and len(result.platform_message_ids) == 1
    assert len(fake_slack.calls("chat.postMessage")[since:]) == 2


async def test_edit_updates_own_message_only(adapter, fake_slack):
    sent = await adapter.send(reply("draft", THREAD))
    edited = await adapter.edit(THREAD, sent.platform_message_ids[0], "**final**")
    assert edited.ok and fake_slack.posted("C0GENERAL1", THREAD.thread_id)[-1]["text"] == "*final*"
    fake_slack.add_channel("C0OTHER001")
    fake_slack.remember({"type": "message", "channel": "C0OTHER001", "user": "U0ALICE001", "ts": "1.000001"})
    not_ours = await adapter.edit(ChatAddress("slack", "T0FAKE0001", "C0OTHER001"), "1.000001", "x")
    assert (not_ours.ok, not_ours.error) == (False, "slack error: cant_update_message")


async def test_check_reports_identity_and_fails_on_a_bad_token(adapter, fake_slack):
    assert "U0BOT00001" in await adapter.check() and "T0FAKE0001" in await adapter.check()
    wrong = SlackAdapter(bot_token="xoxb-wrong", signing_secret="s", api_url=f"{fake_slack.url}/api/")
    with pytest.raises(CredentialRejected) as raised:  # as at start-up: the setting is named
        await wrong.check()
    assert (raised.value.settings, raised.value.reason) == (("bot_token_env",), "invalid_auth")


@pytest.mark.filterwarnings("ignore:The top-level `text` argument is missing")
async def test_fake_enforces_web_api_limits(fake_slack):
    client = AsyncWebClient(token=fake_slack.bot_token, base_url=f"{fake_slack.url}/api/")
    for kwargs, error in (({"channel": "D0ALICE001"}, "no_text"),
                          ({"channel": "D0ALICE001", "text": "x" * (TEXT_LIMIT + 1)}, "msg_too_long"),
                          ({"channel": "C0NOPE0001", "text": "x"}, "channel_not_found")):
        with pytest.raises(SlackApiError) as raised:
            await client.chat_postMessage(**kwargs)
        assert raised.value.response["error"] == error
    ok = await client.chat_postMessage(channel="D0ALICE001", text="x" * TEXT_LIMIT)
    assert ok["ok"]
    with pytest.raises(SlackApiError) as raised:
        await client.chat_update(channel="D0ALICE001", ts="9.999999", text="x")
    assert raised.value.response["error"] == "message_not_found"
    with pytest.raises(SlackApiError) as raised:
        await AsyncWebClient(token="xoxb-nope", base_url=f"{fake_slack.url}/api/").auth_test()
    assert raised.value.response["error"] == "invalid_auth"
    with pytest.raises(SlackApiError) as raised:
        await AsyncWebClient(base_url=f"{fake_slack.url}/api/").auth_test()
    assert raised.value.response["error"] == "not_authed"
    fake_slack.fail_next("users.info", "ratelimited", retry_after=2)
    with pytest.raises(SlackApiError) as raised:
        await client.users_info(user="U0ALICE001")
    assert raised.value.response.status_code == 429 and raised.value.response.headers["Retry-After"] == "2"
    assert (await client.users_info(user="U0ALICE001"))["user"]["profile"]["display_name"] == "Alice"


async def test_fake_enforces_block_kit_limits(fake_slack):
    """Slack Block Kit: a section's text holds 1-3,000 characters, a message at most 50 blocks;
    past that chat.postMessage answers ``invalid_blocks`` and posts nothing."""
    client = AsyncWebClient(token=fake_slack.bot_token, base_url=f"{fake_slack.url}/api/")
    section = {"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3000}}
    before = len(fake_slack.posted("D0ALICE001"))
    for blocks in ([{**section, "text": {"type": "mrkdwn", "text": "x" * 3001}}], [section] * 51):
        with pytest.raises(SlackApiError) as raised:
            await client.chat_postMessage(channel="D0ALICE001", text="fallback", blocks=blocks)
        assert raised.value.response["error"] == "invalid_blocks"
        assert raised.value.response["response_metadata"]["messages"]
    assert len(fake_slack.posted("D0ALICE001")) == before
    await client.chat_postMessage(channel="D0ALICE001", text="fallback", blocks=[section] * 50)
    assert visible_text(fake_slack.posted("D0ALICE001")[-1]) == "\n".join(["x" * 3000] * 50)


BUTTONS = (("✅ Approve", "/approve abc123"), ("❌ Deny", "/deny abc123"))


async def test_a_message_with_buttons_shows_all_of_its_text(adapter, fake_slack):
    """With ``blocks``, Slack shows the blocks and not ``text``, and a section holds at most 3,000
    characters. An approval prompt whose escaped text came to 3,000-3,900 characters (``&``, ``<``, ``>``
    take 4-5 each) used to be cut to 2,990 in its section, hiding the end of the command to approve
    and the instructions from the approver. Every character is now shown, the buttons on the last."""
    command = "cat a.txt && echo '<done>' " * 85 + "; rm -rf ~/important"  # 2,394 characters, 3,584 escaped
    text = f"🔐 Approval needed: I want to run run_shell.\n{command}\nReply /approve abc123 to allow it."
    since = len(fake_slack.posted("D0ALICE001"))
    message = OutboundMessage(DM, text, idempotency_key="approval:abc123", buttons=BUTTONS)
    result = await adapter.send(message)
    assert result.ok
    posts = fake_slack.posted("D0ALICE001")[since:]
    shown = "\n".join(visible_text(m) for m in posts)
    assert "rm -rf ~/important" in shown and shown.rstrip().endswith("Reply /approve abc123 to allow it.")
    escaped = command.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert " ".join(escaped.split()) in " ".join(shown.split())  # parts are cut between words only
    assert [bool(m.get("blocks")) for m in posts] == [False] * (len(posts) - 1) + [True]


async def test_blocks_slack_refuses_are_resent_as_text_once(adapter, fake_slack):
    """``invalid_blocks`` means nothing was posted: the part goes once more as text alone (its
    commands still written in it), so the prompt arrives, once."""
    since = len(fake_slack.posted("D0ALICE001"))
    calls = len(fake_slack.calls("chat.postMessage"))
    fake_slack.fail_next("chat.postMessage", "invalid_blocks")
    result = await adapter.send(OutboundMessage(DM, "Approve? Reply /approve abc123", idempotency_key="approval:x",
                                                buttons=BUTTONS))
    assert result.ok
    posts = fake_slack.posted("D0ALICE001")[since:]
    assert [(m["text"], bool(m.get("blocks"))) for m in posts] == [("Approve? Reply /approve abc123", False)]
    sent = fake_slack.calls("chat.postMessage")[calls:]
    assert len(sent) == 2 and "blocks" in sent[0].params and "blocks" not in sent[1].params


def test_signature_problem_names_each_check() -> None:
    secret, body, now = "s3cret", b'{"type":"event_callback"}', time.time()
    fake = FakeSlack(signing_secret=secret)
    ts = int(now)
    good = {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": fake.sign(body, ts)}
    assert signature_problem(body, good, secret, now) is None
    assert "missing X-Slack-Request-Timestamp" in signature_problem(body, {}, secret, now)
    assert "missing X-Slack-Signature" in signature_problem(body, {"X-Slack-Request-Timestamp": "1"}, secret, now)
    assert "malformed" in signature_problem(body, {**good, "X-Slack-Request-Timestamp": "soon"}, secret, now)
    stale = {"X-Slack-Request-Timestamp": str(ts - 301), "X-Slack-Signature": fake.sign(body, ts - 301)}
    assert "5-minute window" in signature_problem(body, stale, secret, now)
    assert signature_problem(body, {**stale, "X-Slack-Request-Timestamp": str(ts - 299),
                                    "X-Slack-Signature": fake.sign(body, ts - 299)}, secret, now) is None
    assert "signature mismatch" in signature_problem(body + b" ", good, secret, now)
    assert "signature mismatch" in signature_problem(body, good, "other", now)


def test_signature_problem_compares_raw_bytes_and_never_raises() -> None:
    """Header bytes that are not UTF-8 reach the adapter as lone surrogates (aiohttp decodes with
    ``surrogateescape``) and a body need not be UTF-8: both are compared as the bytes that came."""
    secret, now = "s3cret", time.time()
    fake = FakeSlack(signing_secret=secret)
    ts = int(now)
    binary = b'{"text": "\xff\xfe"}'  # signed correctly, not UTF-8: authentic (the adapter then acks it)
    assert signature_problem(binary, {"X-Slack-Request-Timestamp": str(ts),
                                      "X-Slack-Signature": fake.sign(binary, ts)}, secret, now) is None
    body = b"{}"
    good = {"X-Slack-Request-Timestamp": str(ts), "X-Slack-Signature": fake.sign(body, ts)}
    for signature in (good["X-Slack-Signature"] + "\udcff", good["X-Slack-Signature"][:-1] + "é"):
        assert "signature mismatch" in signature_problem(body, {**good, "X-Slack-Signature": signature}, secret, now)
    for stamp in (str(ts) + "\udc80", "١٧٣٥٦٨٩٦٠٠", "9" * 5000, "1e9", "-5"):
        assert "malformed" in signature_problem(body, {**good, "X-Slack-Request-Timestamp": stamp}, secret, now)


async def test_native_stream_appends_extensions_and_falls_back_to_chat_update(adapter, fake_slack):
    """A preview in a thread is a native stream; an edit extending it appends only the new text; an
    edit that is no extension, or of a stream another process began, stops it and uses chat.update;
    the final delivery of a live stream stops it with the rest."""
    parent = f"{int(time.time())}.000900"
    fake_slack.remember({"type": "message", "channel": "D0ALICE001", "user": "U0ALICE001", "ts": parent, "text": "hi"})
    thread = ChatAddress("slack", "T0FAKE0001", "D0ALICE001", parent)
    messages = fake_slack.channels["D0ALICE001"]

    def preview(text: str) -> OutboundMessage:
        return OutboundMessage(thread, text, idempotency_key="s:preview", format="plain", editable=True)

    first = await adapter.send(preview("Hello wor …"))
    (ts,) = first.platform_message_ids
    assert first.ok and messages[ts]["streaming"] and messages[ts]["text"] == "Hello wor"
    assert (await adapter.edit(thread, ts, "Hello world, and more …")).ok
    assert fake_slack.calls("chat.appendStream")[-1].params["markdown_text"] == "ld, and more"
    assert messages[ts]["text"] == "Hello world, and more"
    final = await adapter.send(OutboundMessage(thread, "Hello world, and more. Done.", "s:0", edit_id=ts))
    assert final.ok and final.platform_message_ids == (ts,)
    assert messages[ts]["text"] == "Hello world, and more. Done." and messages[ts]["streaming"] is False

    second = (await adapter.send(preview("One …"))).platform_message_ids[0]
    assert (await adapter.edit(thread, second, "Rewritten …")).ok  # no extension: stopped, then chat.update
    assert messages[second]["streaming"] is False and messages[second]["text"] == "Rewritten …"

    third = (await adapter.send(preview("Begun here …"))).platform_message_ids[0]
    other_process = SlackAdapter(bot_token=fake_slack.bot_token, signing_secret=fake_slack.signing_secret,
                                 api_url=f"{fake_slack.url}/api/")
    assert (await other_process.edit(thread, third, "Begun here, edited there …")).ok
    assert messages[third]["streaming"] is False and messages[third]["text"] == "Begun here, edited there …"


async def test_doctor_names_the_slack_setting_a_refused_token_came_from(tmp_path, fake_slack, fake_openai, capsys,
                                                                         monkeypatch):
    """``gateway doctor`` with a bot token Slack refuses: one line naming ``slack.bot_token_env``,
    as ``gateway run`` says it, not the SDK's multi-line error (and never the token)."""
    from gateway.app.doctor import run_doctor
    from tests.conftest import gateway_config

    monkeypatch.setenv("GATEWAY_TEST_SLACK_BOT_TOKEN", "xoxb-revoked-0009")
    assert await run_doctor(gateway_config(tmp_path, fake_openai, fake_slack=fake_slack)) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("[FAIL] slack:"))
    assert "GATEWAY_TEST_SLACK_BOT_TOKEN" in line and "rejected by Slack" in line and "invalid_auth" in line
    assert "xoxb-revoked" not in out and "The server responded with" not in out
