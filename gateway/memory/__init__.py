"""Long-term memory (issue 10): entries that outlive a conversation, owned by one user or group.

- ``terms``: words and terms of a text (English stems; Chinese and Japanese characters and pairs),
  the text the full-text index gets, lexical similarity and grounding (pure).
- ``recall``: the load pipeline's four gates (query, hybrid recall, rescoring, token budget) and
  the block rendered into the newest user message.
- ``promote``: the write-back promotion gate (explicit "remember ...", model-proposed candidates
  in a fixed JSON schema, evidence check, supersede).
- ``embed``: the optional OpenAI-compatible embeddings client.
- ``service``: wires them for the turn runner; ``commands``: ``/memory``, ``/forget``;
  ``tools``: ``recall_memory``, ``save_memory``.
The SQL lives in ``gateway.memory.store``.
"""
