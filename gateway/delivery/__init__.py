"""Everything that leaves for a platform.

- ``outbox``: ``Delivery``, exactly-once sends from the ``outbox`` table (claim, send, record,
  retry with backoff, ``unconfirmed`` never resent);
- ``streaming``: streamed previews edited in place; ``progress``: the plan message;
- ``typing``: the typing indicator while a turn runs.
"""
