"""The languages of the texts the gateway itself sends (help, command answers, errors, pairing,
approvals, scheduler replies, limits, menus), through GNU gettext catalogs.

Catalogs: ``gateway/core/locales/<locale>/LC_MESSAGES/gateway.po`` (the sources, edited by people)
and ``gateway.mo`` (compiled from them by Babel: ``make i18n``; ``tests/test_i18n.py`` fails when a
``.mo`` does not match its ``.po``, a text in the code has no translation, or an entry is fuzzy or
empty). English is the source language: the English texts in the code are the message ids, so
``en`` needs no catalog (gettext returns the id).

Wrapping a text (the whole recipe, CONTRIBUTING.md "Add or change a text"):

- a text made where a reply is made: ``_("Stopped.")``, with values ``_("Resumed {id}.", id=x)``
  (``str.format`` placeholders; only formatted when values are given);
- a text kept in a module constant: mark it ``N_("...")`` (it stays English there) and translate
  it where it is sent: ``_(CONSTANT)``;
- counts: ``ngettext("{n} file", "{n} files", n, n=n)``.

The language of the reply being made is a context variable: the turn worker and the receiving
code set it with ``using(locale)`` (or run a function on the DB pool with ``in_locale``) for the
message being answered; outside of one, texts stay English. The locale of a message is chosen by
``choose``: the user's ``/language`` choice, else the adapter's hint (Telegram ``language_code``,
the web page's ``Accept-Language``, Feishu Chinese), else ``i18n.default``.

Texts written for the model (system prompt, tool results, context blocks) are never translated:
the model answers in the user's language by itself.
"""

from __future__ import annotations

import gettext as _gettext
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from babel import Locale, UnknownLocaleError

T = TypeVar("T")

DOMAIN = "gateway"
"""The gettext domain: the catalogs are ``<locale>/LC_MESSAGES/gateway.mo``."""
LOCALES_DIR = Path(__file__).resolve().parent / "locales"
SOURCE_LOCALE = "en"
"""The language of the message ids in the code."""
LOCALES: dict[str, str] = {"en": "English", "zh_CN": "简体中文"}
"""Every locale with a complete catalog, and its name in its own language (``/language`` lists them)."""
LANGUAGE_CHOICES: dict[str, str | None] = {"en": "en", "zh": "zh_CN", "auto": None}
"""What ``/language`` accepts besides a locale or tag (``zh-Hans``, ``en-GB``...): ``auto`` clears the
choice (the platform's hint, then ``i18n.default``)."""

_current: ContextVar[str] = ContextVar("gateway_locale", default=SOURCE_LOCALE)


def N_(message: str) -> str:
    """Marks ``message`` for extraction without translating it (module constants); translate it
    where it is sent with ``_(message)``."""
    return message


def negotiate(tag: str | None) -> str | None:
    """The catalog locale for a language tag, or ``None`` when no catalog fits.

    ``tag``: a BCP 47 tag or a POSIX locale (``zh-hans``, ``zh_CN``, ``en-GB``, Telegram's
    ``language_code`` ``"zh-hans"``, Slack's ``"zh-CN"``, one ``Accept-Language`` entry). Parsed
    with Babel; matched on the language subtag (every Chinese tag gets the Simplified Chinese
    catalog, the only Chinese one), as gettext falls back from ``de_AT`` to ``de``.
    """
    if not tag or not isinstance(tag, str):
        return None
    tag = tag.strip().split(";")[0].strip()
    if not tag or tag == "*":
        return None
    if tag in LOCALES:
        return tag
    try:
        parsed = Locale.parse(tag.replace("-", "_"))
    except (UnknownLocaleError, ValueError, TypeError):
        parsed = None
    language = parsed.language if parsed is not None else tag.replace("-", "_").split("_")[0].lower()
    for locale in LOCALES:
        if locale.split("_")[0] == language:
            return locale
    return None


def language_code(locale: str) -> str:
    """The two-letter ISO 639-1 language of a catalog locale (``zh_CN`` -> ``zh``): Telegram's
    ``language_code`` of setMyCommands."""
    return locale.split("_")[0].lower()


def accept_language(header: str | None) -> str | None:
    """The best catalog locale for an HTTP ``Accept-Language`` header (RFC 9110 §12.5.4: entries
    by ``q`` weight, highest first; ``q=0`` means "not this one"), or ``None``."""
    if not header:
        return None
    weighted: list[tuple[float, int, str]] = []
    for index, part in enumerate(header.split(",")[:32]):  # a hostile header cannot cost much
        tag, _sep, params = part.strip().partition(";")
        quality = 1.0
        for param in params.split(";"):
            name, _eq, value = param.strip().partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if tag.strip() and quality > 0:
            weighted.append((-quality, index, tag.strip()))
    for _q, _i, tag in sorted(weighted):
        locale = negotiate(tag)
        if locale is not None:
            return locale
    return None


def choose(chosen: str | None, hint: str | None, default: str) -> str:
    """The locale of a reply: the user's ``/language`` choice (``users.language``), else the
    adapter's hint (``InboundMessage.language``), else ``default`` (``i18n.default``), else English."""
    for candidate in (chosen, hint, default):
        locale = negotiate(candidate)
        if locale is not None:
            return locale
    return SOURCE_LOCALE


@lru_cache(maxsize=16)
def translations(locale: str) -> _gettext.NullTranslations:
    """The compiled catalog of ``locale`` (stdlib ``gettext``; a ``NullTranslations`` that returns
    the message id when there is none)."""
    return _gettext.translation(DOMAIN, localedir=str(LOCALES_DIR), languages=[locale], fallback=True)


def current() -> str:
    """The locale of the reply being made (``SOURCE_LOCALE`` outside ``using``)."""
    return _current.get()


@contextmanager
def using(locale: str | None) -> Iterator[str]:
    """Makes ``locale`` (a catalog locale, or ``None`` for English) the language of ``_`` inside
    the block, in this thread or task only."""
    token = _current.set(locale if locale in LOCALES else SOURCE_LOCALE)
    try:
        yield _current.get()
    finally:
        _current.reset(token)


def in_locale(locale: str | None, fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` run inside ``using(locale)``: for work handed to another thread (the DB pool's
    ``run_in_executor`` does not carry context variables)."""

    def run(*args: Any, **kwargs: Any) -> T:
        with using(locale):
            return fn(*args, **kwargs)

    return run


def _(message: str, /, **values: Any) -> str:
    """``message`` in the current locale; ``str.format(**values)`` applied when values are given."""
    text = translations(_current.get()).gettext(message)
    return text.format(**values) if values else text


def ngettext(singular: str, plural: str, n: int, /, **values: Any) -> str:
    """The singular or plural form for ``n`` in the current locale (the catalog's plural rule),
    formatted with ``values`` when given."""
    text = translations(_current.get()).ngettext(singular, plural, n)
    return text.format(**values) if values else text


def sentences(*parts: str) -> str:
    """Translated sentences joined as the current language writes them: a space between them in
    English, nothing in Chinese (its full stop ``。`` ends a sentence without one)."""
    glue = "" if _current.get().startswith("zh") else " "
    return glue.join(part for part in parts if part)


def translate(locale: str | None, message: str, /, **values: Any) -> str:
    """``message`` in ``locale`` (explicit, for texts made outside a reply: menus)."""
    with using(locale):
        return _(message, **values)
