"""Gateway error types."""


class GatewayError(Exception):
    """Base of every error the gateway raises on purpose."""


class ConfigError(GatewayError):
    """The configuration is invalid or a required secret is missing; the message says which."""
