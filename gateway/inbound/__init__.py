"""From an adapter to the inbox.

- ``receive``: ``Inbound.receive``, the adapters' sink: clean, identify, decide, store, kick;
- ``access``: who may talk to the bot (open, allowlist, pairing) and run guarded tools;
- ``receivers``: receiver leases (one Telegram poller across instances).
"""
