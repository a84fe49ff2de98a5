"""The gateway's Telegram command menus and start-up checks, through python-telegram-bot against the
fake Bot API, which refuses a menu as Telegram does (duplicates, bad names, > 100, descriptions)."""

from __future__ import annotations

import logging

from tests.conftest import gateway_config, start_gateway

ADMIN, OTHER_ADMIN, USER, GROUP = 5559001, 5559002, 5550001, -4000000001
NOT_FOR_GROUPS = {"link", "unlink", "sessions", "resume", "approve_user"}


def set_menu_calls(fake) -> list:
    return fake.calls("setMyCommands")


async def test_menus_are_accepted_and_offer_each_command_where_it_works(tmp_path, fake_telegram, fake_openai,
                                                                       running, caplog):
    fake_telegram.commands.clear()
    fake_telegram.add_chat({"id": ADMIN, "type": "private", "first_name": "Ada"})  # has written to the bot
    since = len(set_menu_calls(fake_telegram))
    config = gateway_config(tmp_path, fake_openai, fake_telegram,
                            access={"mode": "allowlist", "admins": [f"telegram:{ADMIN}", f"telegram:{OTHER_ADMIN}",
                                                                    "slack:T1:U1"]})
    await start_gateway(config, running)

    scopes = [c.params.get("scope", {}).get("type") for c in set_menu_calls(fake_telegram)[since:]
              if not c.params.get("language_code")]  # the menus without a language (per language: test_i18n_*)
    assert sorted(scopes) == ["all_group_chats", "all_private_chats", "chat", "chat"]
    # Every menu Telegram could accept was accepted: one per audience, the admin who never wrote is logged.
    assert sorted(key for key in fake_telegram.commands if "/" not in key) == [
        "all_group_chats", "all_private_chats", f"chat:{ADMIN}"]
    assert not [r for r in caplog.records if "setMyCommands" in r.getMessage() and r.levelno >= logging.WARNING]
    assert any(f"admin chat {OTHER_ADMIN}" in r.getMessage() for r in caplog.records)

    dm, group, admin = fake_telegram.menu(USER), fake_telegram.menu(GROUP), fake_telegram.menu(ADMIN)
    for menu in (dm, group, admin):
        assert len(menu) == len(set(menu)) and {"help", "stop", "status", "new"} <= set(menu)
    assert {"link", "unlink", "sessions", "resume", "memory", "schedule"} <= set(dm)
    assert not NOT_FOR_GROUPS & set(group)  # they answer "in a DM", or would show a link code to the group
    assert "approve_user" not in dm and set(admin) == set(dm) | {"approve_user"}


async def test_open_mode_has_no_admin_menu(tmp_path, fake_telegram, fake_openai, running):
    fake_telegram.commands.clear()
    fake_telegram.add_chat({"id": ADMIN, "type": "private", "first_name": "Ada"})
    config = gateway_config(tmp_path, fake_openai, fake_telegram, access={"admins": [f"telegram:{ADMIN}"]})
    await start_gateway(config, running)
    assert sorted(key for key in fake_telegram.commands if "/" not in key) == ["all_group_chats", "all_private_chats"]
    assert "approve_user" not in fake_telegram.menu(ADMIN)  # no pairing in open mode


async def test_privacy_mode_is_warned_about_at_start_up(tmp_path, fake_telegram, fake_openai, running, caplog):
    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.levelno == logging.WARNING and "privacy mode is on" in r.getMessage()]

    fake_telegram.can_read_all_group_messages = False  # Telegram's default for a new bot
    first = await start_gateway(gateway_config(tmp_path / "a", fake_openai, fake_telegram), running)
    assert len(warned()) == 1 and "/setprivacy" in warned()[0] and "@gateway_test_bot" in warned()[0]
    await first.stop()
    running.remove(first)

    caplog.clear()
    fake_telegram.can_read_all_group_messages = True  # privacy mode off, or the bot is a group admin
    try:
        await start_gateway(gateway_config(tmp_path / "b", fake_openai, fake_telegram), running)
    finally:
        fake_telegram.can_read_all_group_messages = False
    assert warned() == []
