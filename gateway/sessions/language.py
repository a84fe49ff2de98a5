"""``/language``: which language the gateway's own texts take for a user (``gateway.core.i18n``).

``/language`` shows the current one and the choices; ``/language zh`` (or ``en``, ``zh_CN``,
``zh-Hans``, any tag a catalog fits) stores the choice in ``users.language``, so every instance
and every linked account of the user answers in it; ``/language auto`` clears it (the platform's
hint, then ``i18n.default``). Answered on receipt, outside the lane (a database write only).
"""

from __future__ import annotations

from gateway.core.i18n import LANGUAGE_CHOICES, LOCALES, _, choose, negotiate, using
from gateway.core.types import InboundMessage
from gateway.sessions.directory import Directory


def language_reply(directory: Directory, message: InboundMessage, user_id: str, default: str) -> str:
    """Applies ``/language ARGS`` of ``message`` for ``user_id`` and returns the answer, written in
    the language in force afterwards. Blocking (a DB write; run on the DB pool).

    Args:
        default: ``i18n.default``, the locale when neither a choice nor the platform's hint fits.
    """
    arg = message.text.strip().split()[0] if message.text.strip() else ""
    choices = ", ".join(f"{code} ({name})" for code, name in LOCALES.items())
    if not arg:
        with using(message.locale):
            return _("Language: {name}. Choose with /language zh, /language en, or /language auto "
                     "(your app's language). Available: {choices}.",
                     name=LOCALES.get(message.locale or "en", "English"), choices=choices)
    word = arg.lower()
    if word in LANGUAGE_CHOICES:
        chosen = LANGUAGE_CHOICES[word]
    else:
        chosen = negotiate(arg)
        if chosen is None:
            with using(message.locale):
                return _("I have no texts in {language}. Available: {choices}; or /language auto.",
                         language=arg[:40], choices=choices)
    directory.set_language(user_id, chosen)
    locale = choose(chosen, message.language, default)
    with using(locale):
        if chosen is None:
            return _("Language: automatic, from your app's language (now {name}).", name=LOCALES[locale])
        return _("Language set: {name}. I will answer in it from now on.", name=LOCALES[locale])
