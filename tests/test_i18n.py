"""The gateway's message catalogs are complete and current, and languages are chosen as documented.

The catalog checks extract the texts from the code with Babel (the same ``babel.cfg`` and keywords
as ``make i18n``), so a text wrapped in ``_()`` / ``N_()`` without a Simplified Chinese translation,
a fuzzy or empty entry, a translation that lost a ``{placeholder}``, or a ``.mo`` not compiled from
the current ``.po`` fails here."""

from __future__ import annotations

import gettext
import io
import string
from pathlib import Path

import pytest
from babel.messages.extract import DEFAULT_KEYWORDS, extract_from_dir
from babel.messages.frontend import parse_mapping_cfg
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po

from gateway.core import i18n
from gateway.core.config import GatewayConfig
from gateway.core.i18n import LOCALES, LOCALES_DIR, SOURCE_LOCALE, accept_language, choose, negotiate, translate

ROOT = Path(__file__).resolve().parents[1]
TRANSLATED = [locale for locale in LOCALES if locale != SOURCE_LOCALE]


def po_path(locale: str) -> Path:
    return LOCALES_DIR / locale / "LC_MESSAGES" / f"{i18n.DOMAIN}.po"


def code_messages() -> dict[str | tuple[str, str], str]:
    """Every message id in ``gateway/`` and ``adapters/`` as ``make i18n`` extracts it, with where."""
    with open(ROOT / "babel.cfg", encoding="utf-8") as fileobj:
        method_map, options_map = parse_mapping_cfg(fileobj)
    keywords = {**DEFAULT_KEYWORDS, "N_": None}
    found: dict[str | tuple[str, str], str] = {}
    for filename, lineno, message, _comments, _context in extract_from_dir(
            str(ROOT), method_map, options_map, keywords=keywords):
        key = message if isinstance(message, str) else tuple(message[:2])
        found.setdefault(key, f"{filename}:{lineno}")  # type: ignore[index]
    return found


def placeholders(text: str) -> set[str]:
    return {name for _text, name, _spec, _conv in string.Formatter().parse(text) if name is not None}


def test_the_code_has_texts_to_translate():
    messages = code_messages()
    assert "Stopped." in messages and len(messages) > 100  # the extraction config finds the code


@pytest.mark.parametrize("locale", TRANSLATED)
def test_every_text_in_the_code_is_translated(locale):
    with open(po_path(locale), "rb") as fileobj:
        catalog = read_po(fileobj)
    problems = []
    for key, where in code_messages().items():
        msgid = key if isinstance(key, str) else key[0]
        message = catalog.get(msgid)
        if message is None:
            problems.append(f"{where}: {msgid!r} is not in {po_path(locale).name} (run make i18n)")
            continue
        strings = message.string if isinstance(message.string, tuple) else (message.string,)
        if message.fuzzy:
            problems.append(f"{where}: {msgid!r} is fuzzy")
        if not all(strings):
            problems.append(f"{where}: {msgid!r} has no {locale} translation")
        ids = key if isinstance(key, tuple) else (key,)
        wanted = set().union(*(placeholders(text) for text in ids))
        for text in strings:
            if text and placeholders(text) != wanted:
                problems.append(f"{where}: {msgid!r}: the translation has {sorted(placeholders(text))}, "
                                f"the text {sorted(wanted)}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("locale", TRANSLATED)
def test_the_po_has_no_fuzzy_empty_or_stale_entries(locale):
    with open(po_path(locale), "rb") as fileobj:
        catalog = read_po(fileobj)
    in_code = {key if isinstance(key, str) else key[0] for key in code_messages()}
    entries = [m for m in catalog if m.id]
    assert not [m.id for m in entries if m.fuzzy]
    assert not [m.id for m in entries if not all(m.string if isinstance(m.string, tuple) else (m.string,))]
    assert not catalog.obsolete
    stale = [m.id for m in entries if (m.id if isinstance(m.id, str) else m.id[0]) not in in_code]
    assert not stale, f"texts no longer in the code (run make i18n): {stale}"


@pytest.mark.parametrize("locale", TRANSLATED)
def test_the_compiled_catalog_matches_its_source(locale):
    """The committed ``.mo`` is what compiling the ``.po`` gives now (``make i18n-compile``)."""
    with open(po_path(locale), "rb") as fileobj:
        source = read_po(fileobj)
    compiled = io.BytesIO()
    write_mo(compiled, source)
    compiled.seek(0)
    expected = gettext.GNUTranslations(compiled)
    with open(po_path(locale).with_suffix(".mo"), "rb") as fileobj:
        shipped = gettext.GNUTranslations(fileobj)
    assert shipped._catalog == expected._catalog, "gateway.mo is stale: run make i18n-compile"  # type: ignore[attr-defined]


def test_the_catalogs_are_installed_with_the_package():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gateway"]
    assert "core/locales/*/LC_MESSAGES/*.mo" in data
    assert translate("zh_CN", "Stopped.") == "已停止。"  # loaded through gettext from the package folder


@pytest.mark.parametrize(("tag", "locale"), [
    ("zh-hans", "zh_CN"), ("zh", "zh_CN"), ("zh-CN", "zh_CN"), ("zh_TW", "zh_CN"), ("en", "en"), ("en-GB", "en"),
    ("de", None), ("", None), (None, None), ("*", None), ("not a tag!", None),
])
def test_language_tags_map_to_catalogs(tag, locale):
    assert negotiate(tag) == locale


def test_accept_language_takes_the_best_weighted_language_we_have():
    assert accept_language("de-DE,de;q=0.9,zh-CN;q=0.8,en;q=0.7") == "zh_CN"
    assert accept_language("en;q=0.5, zh;q=0.9") == "zh_CN"
    assert accept_language("zh;q=0, en") == "en"  # q=0: not this one
    assert accept_language("fr, de") is None
    assert accept_language(None) is None


def test_a_choice_beats_the_platform_which_beats_the_default():
    assert choose("en", "zh-hans", "zh_CN") == "en"
    assert choose(None, "zh-hans", "en") == "zh_CN"
    assert choose(None, "fr", "zh_CN") == "zh_CN"
    assert choose(None, None, "xx") == "en"


def test_texts_follow_the_locale_in_use_and_stay_english_outside():
    from gateway.sessions.commands import command_menu, help_text

    with i18n.using("zh_CN"):
        assert "命令：" in help_text()
        assert i18n._("Resumed conversation {id}.", id="abcd1234") == "已恢复对话 abcd1234。"
    assert help_text().splitlines()[1] == "Commands:"
    assert dict(command_menu("dm", "zh_CN"))["help"] == "这个机器人能做什么"
    assert dict(command_menu("dm"))["help"] == "What this bot can do"


def test_i18n_default_accepts_known_languages_only():
    assert GatewayConfig(i18n={"default": "zh"}).i18n.default == "zh_CN"
    with pytest.raises(ValueError, match="no catalog"):
        GatewayConfig(i18n={"default": "fr"})


def test_a_language_choice_is_kept_with_the_user_and_follows_link_and_unlink(db_url):
    """``users.language`` on both backends: set and cleared, read by ``identify``, kept by the
    surviving user of ``/link`` (when it had none) and by the account ``/unlink`` detaches."""
    from gateway.core.types import ChatAddress, InboundMessage, Sender
    from gateway.sessions.directory import Directory
    from gateway.store.db import create_db_engine

    def dm(platform: str, user: str) -> InboundMessage:
        return InboundMessage(ChatAddress(platform, "T1", user), f"{user}:1", "dm", Sender(user, "A"), "hi")

    engine = create_db_engine(db_url)
    try:
        directory = Directory(engine)
        telegram, slack = dm("telegram", "5550001"), dm("slack", "U0001")
        first = directory.identify(telegram)
        assert first.language is None
        directory.set_language(first.user_id, "zh_CN")
        assert directory.identify(telegram).language == "zh_CN"
        directory.set_language(first.user_id, None)
        assert directory.identify(telegram).language is None

        directory.set_language(first.user_id, "zh_CN")
        other = directory.identify(slack)
        code = directory.new_code(other.user_id, "link")
        directory.link(code, first.user_id)  # the Telegram account joins the Slack user, which chose nothing
        assert directory.identify(telegram).language == directory.identify(slack).language == "zh_CN"
        assert directory.unlink(telegram)
        detached = directory.identify(telegram)
        assert detached.user_id != other.user_id and detached.language == "zh_CN"
    finally:
        engine.dispose()


def test_sentences_are_joined_as_each_language_writes_them():
    """English puts a space between sentences, Chinese none (``/files`` once read "…文件。 文件在…")."""
    from gateway.core.i18n import _, sentences, using

    with using("zh_CN"):
        text = sentences(_("I keep no files of yours."), _("Files are kept as long as their conversation."))
        assert " " not in text and text.startswith("我没有保存你的文件。")
    with using("en"):
        assert sentences("One.", "", "Two.") == "One. Two."
