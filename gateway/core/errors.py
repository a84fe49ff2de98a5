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


class ContextUnavailable(GatewayError):
    """A platform would not give the earlier messages a turn wanted to show (a missing scope, a
    thread or message that is gone, a rate limit); ``str(exc)`` says why in plain words and never
    holds a secret. Raised by ``ContextReader`` methods; the turn goes on without that context."""


class MediaError(GatewayError):
    """A file that came with a message cannot be used; ``user_message`` says why in plain words
    (shown to the user and noted for the model), never a secret or a URL with a token.

    Raised by ``MediaAdapter.download`` and the media pipeline (``gateway.media``).
    """

    def __init__(self, user_message: str) -> None:
        super().__init__(user_message)
        self.user_message = user_message


class NotDownloadable(MediaError):
    """The platform never hands this kind of file to a bot (Feishu stickers: "暂不支持获取表情包资源",
    Feishu Open Platform, im-v1 message-resource get). The file is described to the model by its
    kind, with no note and no download attempt."""


class FileTooBig(MediaError):
    """The file is larger than a limit: ``limit`` bytes, set by ``who`` (``Telegram bots``,
    ``this gateway``) for ``what`` (``files``, ``document files``); ``size`` is the file's size
    when known: ``too big (30.0 MB); this gateway can take document files up to 20 MB``."""

    def __init__(self, size: int | None, limit: int, who: str, what: str = "files") -> None:
        shown = f"{size / 1e6:.1f} MB" if size is not None else "larger than the limit"
        super().__init__(f"too big ({shown}); {who} can take {what} up to {limit / 1e6:g} MB")
        self.size, self.limit, self.who = size, limit, who


class DownloadFailed(MediaError):
    """The platform did not hand over the file (expired, refused, not a file but a sign-in page,
    unreachable). ``retryable``: a later try may succeed (network, 5xx)."""

    def __init__(self, user_message: str, retryable: bool = False) -> None:
        super().__init__(user_message)
        self.retryable = retryable


class BlobMissing(GatewayError):
    """A blob the transcript refers to is not in the store (deleted by retention or by the user)."""
