"""What users are told about usage and limits: every text of ``/usage`` and of a limit's reply, in
one place (to be wrapped for translation). Placeholders are filled with ``str.format``."""

from __future__ import annotations

LIMIT_REPLIES = {
    "user_messages_per_minute": ("⏳ You sent more than {limit} messages in a minute, so I did not answer "
                                 "the last one(s). You can write again from {reset} (in {wait} s)."),
    "user_monthly_usd": ("💸 You have used this month's budget ({spent} of {limit}), so I did not answer. "
                         "It resets on {reset}."),
    "user_daily_usd": ("💸 You have used today's budget ({spent} of {limit}), so I did not answer. "
                       "It resets at {reset}."),
    "chat_daily_usd": ("💸 This chat has used today's budget ({spent} of {limit}), so I did not answer. "
                       "It resets at {reset}."),
}
"""The one reply a user over a limit gets, by limit name (the ``limits.*`` key)."""

LIMIT_NAMES = {
    "user_daily_usd": "{limit} a day",
    "user_monthly_usd": "{limit} a month",
    "chat_daily_usd": "{limit} a day for this chat",
    "user_messages_per_minute": "{limit} messages a minute",
}
"""How ``/usage`` names each configured limit."""

USAGE_HEADER = "Your usage (days in {zone}):"
USAGE_PERIOD = ("{name}: {cost} · {tokens_in} tokens in ({cached} of them cached), {tokens_out} out · "
                "{calls} model calls")
USAGE_TODAY = "Today ({day})"
USAGE_MONTH = "This month ({month})"
USAGE_CHAT_TODAY = "This chat today"
USAGE_NO_LIMITS = "Limits: none."
USAGE_LIMITS = "Limits: {limits}."
USAGE_LEFT = "{name}: {left} left, resets {reset}"
USAGE_BY_MODEL = "This month by model:"
USAGE_MODEL_LINE = "• {model} ({provider}): {cost} · {tokens_in} in ({cached} cached), {tokens_out} out"
USAGE_EVERYONE = "Everyone (you are an admin): today {today}, this month {month}."
USAGE_TOP_USERS = "Users this month, most first:"
USAGE_USER_LINE = "• {name}: today {today}, this month {month} · {calls} model calls"
USAGE_NONE = "No model calls yet."
