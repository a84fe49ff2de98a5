"""Gateway error types."""


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """The configuration is invalid or a required secret is missing; the message says which."""


class TurnInterrupted(GatewayError):
    """A turn stopped at a step boundary because the gateway is stopping: its inbox rows stay
    pending and it resumes from the transcript at the next start (nothing was sent for it)."""
