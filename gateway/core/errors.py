"""Gateway error types."""


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """The configuration is invalid or a required secret is missing; the message says which."""


class CredentialRejected(GatewayError):
    """A platform refused one of the gateway's credentials at start-up (start-up must stop).

    Raised by ``Adapter.start`` / ``start_receiving``; the CLI turns it into one line naming the
    environment variable (``TELEGRAM_BOT_TOKEN was rejected by Telegram (401 Unauthorized)``).

    Attributes:
        platform: ``telegram`` | ``slack`` | ``feishu``: also the config section.
        settings: the section's keys naming the variables concerned, e.g. ``("token_env",)``,
            ``("app_id_env", "app_secret_env")`` when the platform does not say which one.
        reason: the platform's answer (``401 Unauthorized``, ``invalid_auth``); never a secret.
    """

    def __init__(self, platform: str, settings: tuple[str, ...], reason: str) -> None:
        super().__init__(f"{platform}.{' / '.join(settings)}: rejected by {platform} ({reason})")
        self.platform, self.settings, self.reason = platform, settings, reason


class TurnInterrupted(GatewayError):
    """A turn stopped at a step boundary because the gateway is stopping: its inbox rows stay
    pending and it resumes from the transcript at the next start (nothing was sent for it)."""
