"""The contracts every part shares; the only part of the gateway the adapters import.

- ``types``: message types (``InboundMessage``, ``OutboundMessage``, ``ChatAddress``, ...);
- ``ports``: the ``Adapter`` protocol and the inbound sink; ``errors``: the error tree;
- ``config``: the configuration (pydantic, TOML + ``GATEWAY__*``); ``window``: the context-window
  policy; ``session_keys``: which conversation a message belongs to.
"""
