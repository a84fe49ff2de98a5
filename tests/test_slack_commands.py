"""Slack slash commands, the pure parts: the name table (prefix, explicit names), a command payload
as the command message it stands for, the ephemeral target carried in ``reply_to_id``, the
configuration's checks, and the app manifest in ``deploy/`` matching what the gateway serves."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from adapters.slack.commands import SlashCommands, command_to_inbound, ephemeral_reply_to, ephemeral_target
from adapters.slack.manifest import BOT_EVENTS, BOT_SCOPES
from adapters.slack.streams import PREVIEW_MARK, without_mark
from gateway.app.cli import SLACK_URL_EXAMPLE
from gateway.app.wiring import slack_commands, slack_manifest
from gateway.core.config import load_config
from gateway.core.errors import ConfigError
from gateway.delivery.streaming import PREVIEW_SUFFIX
from gateway.sessions.commands import MENU
from tests.fakes.slack import DEFAULT_SCOPES

ROOT = Path(__file__).resolve().parents[1]
NAMES = [name for name, _, _ in MENU]


def test_names_resolve_with_a_prefix_hyphens_and_explicit_names():
    table = SlashCommands(NAMES, "agent-", {"/reset": "new"})
    assert table.resolve("/agent-new") == "new"
    assert table.resolve("/AGENT-STATUS") == "status"
    assert table.resolve("/agent-forget-files") == "forget_files"  # a hyphen typed, the gateway's underscore
    assert table.resolve("/reset") == "new"
    assert table.resolve("/new") is None and table.resolve("/agent-deploy") is None
    names = table.slack_names()
    assert names["/agent-new"] == "new" and names["/reset"] == "new" and "/new" not in names
    plain = SlashCommands(NAMES)
    assert plain.resolve("/new") == "new" and plain.resolve("/memory") == "memory"
    with pytest.raises(ValueError, match="unknown command 'deploy'"):
        SlashCommands(NAMES, names={"/ship": "deploy"})


def test_answers_name_the_commands_as_slack_knows_them():
    table = SlashCommands(NAMES, "agent-")
    text = "Started a new conversation. The previous one is listed in /sessions; /resume ID, /forget_files."
    assert table.rename(text) == ("Started a new conversation. The previous one is listed in /agent-sessions; "
                                  "/agent-resume ID, /agent-forget_files.")
    assert table.rename("see https://example.com/new and a/run or /newer") == \
        "see https://example.com/new and a/run or /newer"
    assert SlashCommands(NAMES).rename("/new") == "/new"


def test_a_payload_becomes_the_command_message_with_an_ephemeral_reply():
    fields = {"command": "/agent-link", "text": "  ABC123 ", "user_id": "U0ALICE001", "user_name": "alice",
              "channel_id": "C0GENERAL1", "team_id": "T0FAKE0001",
              "trigger_id": "13345224609.738474920.8088930838d88f008e0",
              "response_url": "https://hooks.slack.com/commands/T0FAKE0001/1234/abcd"}
    message = command_to_inbound(fields, SlashCommands(NAMES, "agent-"), "T0FALLBACK")
    assert not isinstance(message, str)
    assert (message.command, message.text, message.chat_type) == ("link", "ABC123", "group")
    assert message.address.chat_id == "C0GENERAL1" and message.address.thread_id is None
    assert message.address.tenant == "T0FAKE0001" and message.sender.user_id == "U0ALICE001"
    assert message.message_id == "C0GENERAL1:cmd:13345224609.738474920.8088930838d88f008e0"
    target = ephemeral_target(message.reply_to_id)
    assert target is not None and target.user_id == "U0ALICE001"
    assert target.response_url == "https://hooks.slack.com/commands/T0FAKE0001/1234/abcd"
    dm = command_to_inbound({**fields, "channel_id": "D0ALICE001", "command": "/agent-new"},
                            SlashCommands(NAMES, "agent-"), "T0")
    assert not isinstance(dm, str) and dm.chat_type == "dm" and dm.command == "new"
    assert command_to_inbound({**fields, "command": "/weather"}, SlashCommands(NAMES, "agent-"), "T0") == "/weather"


def test_the_ephemeral_target_fits_the_outbox_column():
    assert ephemeral_target(None) is None and ephemeral_target("C0GENERAL1:1735689600.000100") is None
    long_url = "https://hooks.slack.com/commands/" + "x" * 300
    reply_to = ephemeral_reply_to("U0ALICE001", long_url)
    assert reply_to == "ephemeral:U0ALICE001" and len(reply_to) <= 255
    assert ephemeral_target(reply_to) == ephemeral_target(ephemeral_reply_to("U0ALICE001", None))
    assert ephemeral_target(ephemeral_reply_to("U1", "https://a b")).response_url is None  # not one URL


def test_configuration_refuses_bad_names_and_too_many_prompts():
    with pytest.raises(ConfigError, match="command_prefix"):
        load_config(None, slack={"command_prefix": "Agent "})
    with pytest.raises(ConfigError, match="suggested_prompts"):
        load_config(None, slack={"suggested_prompts": ["a", "b", "c", "d", "e"]})
    with pytest.raises(ConfigError, match="command_names"):
        load_config(None, slack={"command_names": {"/has space": "new"}})
    with pytest.raises(ConfigError, match="unknown command 'deploy'"):
        slack_commands(load_config(None, slack={"command_names": {"/ship": "deploy"}}))


def test_the_deploy_manifest_is_what_the_default_configuration_serves():
    shipped = yaml.safe_load((ROOT / "deploy" / "slack-manifest.yaml").read_text())
    assert shipped == slack_manifest(load_config(None), SLACK_URL_EXAMPLE)  # `gateway slack-manifest` output
    declared = {c["command"] for c in shipped["features"]["slash_commands"]}
    assert declared == {f"/{name}" for name in NAMES}
    assert set(DEFAULT_SCOPES) <= set(BOT_SCOPES) and {"commands", "assistant:write"} <= set(BOT_SCOPES)
    assert {"assistant_thread_started", "message.im", "app_mention"} <= set(BOT_EVENTS)

    socket = slack_manifest(load_config(None, slack={"mode": "socket", "command_prefix": "agent-"}), "unused")
    settings = socket["settings"]
    assert settings["socket_mode_enabled"] is True and "request_url" not in settings["interactivity"]
    assert all("url" not in c and c["command"].startswith("/agent-") for c in socket["features"]["slash_commands"])


def test_the_preview_mark_is_the_gateways():
    assert PREVIEW_MARK == PREVIEW_SUFFIX
    assert without_mark("half a sentence" + PREVIEW_SUFFIX) == "half a sentence"


def test_a_menu_description_splits_into_what_it_does_and_its_usage_hint():
    """Slack shows ``description`` and ``usage_hint`` side by side: an admins-only aside keeps its
    words, the arguments go to the hint (never half a parenthesis in each)."""
    from adapters.slack.manifest import split_usage

    assert split_usage("model", "This chat's model (admins: /model NAME)") == ("This chat's model (admins)", "NAME")
    assert split_usage("resume", "Continue a conversation: /resume ID") == ("Continue a conversation", "ID")
    assert split_usage("new", "Start a fresh conversation") == ("Start a fresh conversation", "")
    manifest = slack_manifest(load_config(None), SLACK_URL_EXAMPLE)
    for entry in manifest["features"]["slash_commands"]:
        assert entry["description"].count("(") == entry["description"].count(")"), entry
        assert entry.get("usage_hint", "").count("(") == entry.get("usage_hint", "").count(")"), entry
