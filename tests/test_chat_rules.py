"""``[[chats]]`` rule matching and precedence (``gateway.core.chats``), the configuration's checks of
rules, and the ``chat_settings`` store on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from gateway.core.chats import ChatRule, ChatSettings, resolve
from gateway.core.config import load_config
from gateway.core.errors import ConfigError
from gateway.sessions.chat_settings import ChatOverrides
from gateway.store.db import create_db_engine, upgrade

RULES = [
    ChatRule(platform="telegram", route="platform", persona="p-platform"),
    ChatRule(platform="telegram", user="42", route="user"),
    ChatRule(platform="telegram", chat="-100", route="chat", busy_policy="merge"),
    ChatRule(platform="telegram", chat="-100", user="42", route="chat+user"),
    ChatRule(platform="telegram", chat="-100", thread="7", route="thread", toolset=["web_fetch"]),
    ChatRule(platform="slack", chat="C1", persona="first"),
    ChatRule(platform="slack", chat="C1", persona="second"),  # same weight, later: wins
]


@pytest.mark.parametrize(("platform", "chat", "thread", "user", "route"), [
    ("telegram", "5", None, "9", "platform"),      # only the platform rule applies
    ("telegram", "5", None, "42", "user"),         # user (2) beats platform (1)
    ("telegram", "-100", None, "9", "chat"),       # chat (4) beats platform
    ("telegram", "-100", None, "42", "chat+user"),  # chat + user (6) beats chat (4) and user (2)
    ("telegram", "-100", "7", "42", "thread"),     # thread + chat (12) beats everything
    ("telegram", "-100", "8", "9", "chat"),        # another thread: the chat's rule
    ("feishu", "-100", None, "42", None),          # no rule for the platform
])
def test_the_most_specific_applying_rule_gives_each_setting(platform, chat, thread, user, route):
    assert resolve(RULES, platform, chat, thread, user).route == route


def test_settings_merge_across_rules_and_chat_overrides_win():
    got = resolve(RULES, "telegram", "-100", "7", "42")
    # route and toolset from the thread rule, busy policy from the chat rule, persona from the platform's
    assert got == ChatSettings(route="thread", persona="p-platform", toolset=("web_fetch",), busy_policy="merge")
    assert resolve(RULES, "slack", "C1", None, "U1").persona == "second"  # equal weight: the later rule
    overridden = resolve(RULES, "telegram", "-100", "7", "42", {"route": "set-in-chat", "busy_policy": "queue"})
    assert (overridden.route, overridden.busy_policy, overridden.toolset) == ("set-in-chat", "queue", ("web_fetch",))


def test_rules_are_checked_at_load():
    with pytest.raises(ConfigError, match="no route named 'nosuch'"):
        load_config(None, chats=[{"platform": "telegram", "route": "nosuch"}])
    with pytest.raises(ConfigError, match="no route named 'other'"):
        load_config(None, chats=[{"platform": "telegram", "models": ["default", "other"]}])
    with pytest.raises(ConfigError, match="thread needs chat"):
        load_config(None, chats=[{"platform": "slack", "thread": "1.2"}])
    with pytest.raises(ConfigError, match="chat needs platform"):
        load_config(None, chats=[{"chat": "C1"}])
    with pytest.raises(ConfigError, match="busy_policy"):
        load_config(None, chats=[{"platform": "slack", "busy_policy": "drop"}])
    with pytest.raises(ConfigError, match=r"chats\.0\.modle"):  # unknown keys are errors
        load_config(None, chats=[{"platform": "slack", "modle": "x"}])
    config = load_config(None, llm={"routes": {"alt": {"models": ["default:gpt-4o"]}}},
                         chats=[{"platform": "slack", "route": "alt", "models": ["alt", "default"]}],
                         personas={"pirate": "Arr."})
    assert config.chats[0].route == "alt" and config.personas == {"pirate": "Arr."}


def test_chat_overrides_are_stored_per_chat_and_unset_with_none(db_url):
    engine = create_db_engine(db_url)
    upgrade(engine)
    overrides = ChatOverrides(engine)
    assert overrides.get("telegram", "bot1", "-100") == {}
    overrides.set("telegram", "bot1", "-100", "route", "alt", "telegram:1")
    overrides.set("telegram", "bot1", "-100", "persona", "Arr.", "telegram:1")
    overrides.set("telegram", "bot2", "-100", "busy_policy", "merge", "telegram:2")  # another bot's chat
    assert overrides.get("telegram", "bot1", "-100") == {"route": "alt", "persona": "Arr."}
    overrides.set("telegram", "bot1", "-100", "persona", None, "telegram:1")
    assert overrides.get("telegram", "bot1", "-100") == {"route": "alt"}
    assert overrides.get("telegram", "bot2", "-100") == {"busy_policy": "merge"}
    with pytest.raises(ValueError, match="not a chat setting"):
        overrides.set("telegram", "bot1", "-100", "toolset", "x", "telegram:1")
    engine.dispose()
