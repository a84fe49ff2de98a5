"""What a chat is told when the model failed a turn, in the user's language.

``agent/`` writes ``ModelError.user_message`` in English (it imports nothing of the gateway and has
no catalogs); for the reasons it names (``agent.model_errors``) the gateway has its own texts here,
translated where the reply is made. A reason without one keeps the agent's English words.
"""

from __future__ import annotations

from agent.model import ModelError
from gateway.core.i18n import N_, SOURCE_LOCALE, _, current

MODEL_ERROR_TEXTS: dict[str, str] = {
    "timeout": N_("The model did not answer in time; try again."),
    "connection": N_("The model is unreachable right now."),
    "stream": N_("The model's answer broke off; try again."),
    "auth": N_("The model rejected the gateway's credentials."),
    "rate_limited": N_("The model is rate limited; try again shortly."),
    "server": N_("The model returned an error ({status})."),
    "not_found": N_("The model returned an error ({status})."),
    "request": N_("The model returned an error ({status})."),
    "unavailable": N_("The model is unavailable right now; try again shortly."),
    "context_length": N_("This conversation is too long for the model, even with older turns summarised. "
                         "Start a new one with /new, or send a shorter message."),
}
"""By ``ModelError.reason``; ``{status}`` is the HTTP status."""


def model_error_text(exc: ModelError) -> str:
    """``exc.user_message`` in the current locale: the agent's own words in English, the text of
    ``MODEL_ERROR_TEXTS`` for its reason otherwise (the English words when there is none)."""
    text = MODEL_ERROR_TEXTS.get(exc.reason)
    if current() == SOURCE_LOCALE or text is None:
        return exc.user_message
    return _(text, status=exc.status if exc.status is not None else "?")
