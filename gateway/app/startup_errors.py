"""Why the gateway did not start, in one line for the operator (``gateway run`` prints it on stderr
and exits with status 2; the traceback is logged at DEBUG only, redacted like every log record).

    TELEGRAM_BOT_TOKEN was rejected by Telegram (401 Unauthorized)
    SLACK_BOT_TOKEN was rejected by Slack (invalid_auth)
    FEISHU_APP_SECRET was rejected by Feishu (tenant_access_token: code 10014, app secret invalid)
    database.url (postgresql+psycopg://gw:***@db:5432/gw) is unreachable: connection refused ...
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.core.config import GatewayConfig
from gateway.core.errors import ConfigError, CredentialRejected

PLATFORM_NAMES = {"telegram": "Telegram", "slack": "Slack", "feishu": "Feishu"}
DEBUG_HINT = '(set logging.level = "DEBUG" or GATEWAY__LOGGING__LEVEL=DEBUG for the traceback)'


def describe(exc: BaseException, config: GatewayConfig, redact: Callable[[str], str], what: str = "start-up") -> str:
    """One line naming the setting at fault and the cause; ``redact`` is applied to every part
    taken from the exception (driver and SDK messages may quote URLs or tokens). ``what`` names
    the step for errors without a known setting (``start-up failed: NetworkError: ...``)."""
    if isinstance(exc, CredentialRejected):
        section = getattr(config, exc.platform, None)
        names = [str(getattr(section, setting, setting)) for setting in exc.settings]
        verb = "was" if len(names) == 1 else "were"
        platform = PLATFORM_NAMES.get(exc.platform, exc.platform)
        return redact(f"{' / '.join(names)} {verb} rejected by {platform} ({exc.reason})")
    if isinstance(exc, ConfigError):
        return redact(str(exc))
    from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

    if isinstance(exc, SQLAlchemyError):
        cause = getattr(exc, "orig", None) or exc
        state = "is unreachable" if isinstance(exc, OperationalError | InterfaceError) else "cannot be used"
        return redact(f"database.url ({_safe_url(config.database.url)}) {state}: {_one_line(cause)}")
    return redact(f"{what} failed: {type(exc).__name__}: {_one_line(exc)} {DEBUG_HINT}")


def url_password(url: str) -> list[str]:
    """The password in a database URL (to redact it), or ``[]``."""
    try:
        from sqlalchemy.engine import make_url

        password = make_url(url).password
    except Exception:
        return []
    return [str(password)] if password else []


def _safe_url(url: str) -> str:
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "an unparsable URL"


def _one_line(exc: BaseException) -> str:
    """The exception's message on one line (driver messages span several), at most 300 chars."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + " …"
