"""What users are told about usage and limits: every text of ``/usage`` and of a limit's reply, in
one place, marked for the gettext catalogs (``N_``) and translated where sent (``_``, which fills
the ``str.format`` placeholders)."""

from __future__ import annotations

from gateway.core.i18n import N_

LIMIT_REPLIES = {
    "user_messages_per_minute": N_("⏳ You sent more than {limit} messages in a minute, so I did not answer "
                                   "the last one(s). You can write again from {reset} (in {wait} s)."),
    "user_monthly_usd": N_("💸 You have used this month's budget ({spent} of {limit}), so I did not answer. "
                           "It resets on {reset}."),
    "user_daily_usd": N_("💸 You have used today's budget ({spent} of {limit}), so I did not answer. "
                         "It resets at {reset}."),
    "chat_daily_usd": N_("💸 This chat has used today's budget ({spent} of {limit}), so I did not answer. "
                         "It resets at {reset}."),
}
"""The one reply a user over a limit gets, by limit name (the ``limits.*`` key)."""

LIMIT_NAMES = {
    "user_daily_usd": N_("{limit} a day"),
    "user_monthly_usd": N_("{limit} a month"),
    "chat_daily_usd": N_("{limit} a day for this chat"),
    "user_messages_per_minute": N_("{limit} messages a minute"),
}
"""How ``/usage`` names each configured limit."""

USAGE_HEADER = N_("Your usage (days in {zone}):")
USAGE_PERIOD = N_("{name}: {cost} · {tokens_in} tokens in ({cached} of them cached), {tokens_out} out · "
                   "{calls} model calls")
USAGE_TODAY = N_("Today ({day})")
USAGE_MONTH = N_("This month ({month})")
USAGE_CHAT_TODAY = N_("This chat today")
USAGE_NO_LIMITS = N_("Limits: none.")
USAGE_LIMITS = N_("Limits: {limits}.")
USAGE_LEFT = N_("{name}: {left} left, resets {reset}")
USAGE_BY_MODEL = N_("This month by model:")
USAGE_MODEL_LINE = N_("• {model} ({provider}): {cost} · {tokens_in} in ({cached} cached), {tokens_out} out")
USAGE_EVERYONE = N_("Everyone (you are an admin): today {today}, this month {month}.")
USAGE_TOP_USERS = N_("Users this month, most first:")
USAGE_USER_LINE = N_("• {name}: today {today}, this month {month} · {calls} model calls")
USAGE_NONE = N_("No model calls yet.")
