"""``/usage``: the sender's spend today and this month, their limits and what is left; an admin
also sees everyone's totals and the users who spent most this month."""

from __future__ import annotations

from gateway.core.i18n import _
from gateway.ops import usage_texts as t
from gateway.ops.usage import Totals
from gateway.ops.usage_limits import UsageLimits, usd


def _period(name: str, totals: Totals) -> str:
    return _(t.USAGE_PERIOD, name=name, cost=usd(totals.cost_usd), tokens_in=totals.prompt_tokens,
                                 cached=totals.cached_tokens, tokens_out=totals.completion_tokens, calls=totals.calls)


def usage_reply(limits: UsageLimits, *, user_id: str | None, chat_key: str, is_admin: bool) -> str:
    """The answer to ``/usage`` for ``user_id`` writing in ``chat_key`` (figures from ``usage``)."""
    calendar, ledger, c = limits.calendar, limits.ledger, limits.config
    today_day = calendar.day()
    first, last = calendar.month_days(today_day)
    today, month = limits.report_totals(user_id=user_id)
    lines = [_(t.USAGE_HEADER, zone=calendar.zone_name),
             _period(_(t.USAGE_TODAY, day=today_day), today),
             _period(_(t.USAGE_MONTH, month=today_day[:7]), month)]
    chat_today, _chat_month = limits.report_totals(chat_key=chat_key)
    if c.chat_daily_usd is not None:
        lines.append(_period(_(t.USAGE_CHAT_TODAY), chat_today))
    configured = [(name, value) for name, value in (
        ("user_daily_usd", c.user_daily_usd), ("user_monthly_usd", c.user_monthly_usd),
        ("chat_daily_usd", c.chat_daily_usd), ("user_messages_per_minute", c.user_messages_per_minute))
        if value is not None]
    if not configured:
        lines.append(_(t.USAGE_NO_LIMITS))
    else:
        names = [_(t.LIMIT_NAMES[name], limit=value if name.endswith("minute") else usd(value))
                 for name, value in configured]
        lines.append(_(t.USAGE_LIMITS, limits=", ".join(names)))
        spent = {"user_daily_usd": today.cost_usd, "user_monthly_usd": month.cost_usd,
                 "chat_daily_usd": chat_today.cost_usd}
        resets = {"user_daily_usd": calendar.next_day(), "user_monthly_usd": calendar.next_month(),
                  "chat_daily_usd": calendar.next_day()}
        for name, value in configured:
            if name in spent:
                lines.append(_(t.USAGE_LEFT, name=_(t.LIMIT_NAMES[name], limit=usd(value)),
                                                 left=usd(max(0.0, value - spent[name])),
                                                 reset=calendar.show(resets[name])))
    models = ledger.by_model(first_day=first, last_day=last, user_id=user_id)
    if models:
        lines.append(_(t.USAGE_BY_MODEL))
        lines += [_(t.USAGE_MODEL_LINE, model=model, provider=provider, cost=usd(s.cost_usd),
                                            tokens_in=s.prompt_tokens, cached=s.cached_tokens,
                                            tokens_out=s.completion_tokens) for provider, model, s in models]
    if is_admin:
        everyone_today, everyone_month = limits.report_totals()
        lines.append("")
        lines.append(_(t.USAGE_EVERYONE, today=usd(everyone_today.cost_usd), month=usd(everyone_month.cost_usd)))
        users = ledger.by_user(first_day=first, last_day=last)
        if users:
            lines.append(_(t.USAGE_TOP_USERS))
            for uid, name, totals in users:
                spent_today = ledger.cost(first_day=today_day, last_day=today_day, user_id=uid) if uid != "-" else 0.0
                lines.append(_(t.USAGE_USER_LINE, name=name, today=usd(spent_today), month=usd(totals.cost_usd),
                                                      calls=totals.calls))
        else:
            lines.append(_(t.USAGE_NONE))
    return "\n".join(lines)
