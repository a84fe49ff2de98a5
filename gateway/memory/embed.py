"""The optional embeddings client: any OpenAI-compatible ``POST /embeddings`` endpoint.

Used for the vector half of hybrid recall. Without one, recall is keyword-only; a failing call
only means this turn's recall (or this entry) goes without a vector.
"""

from __future__ import annotations

import openai


class Embedder:
    """Embeds texts with ``model`` at ``base_url`` (OpenAI's ``text-embedding-3-small`` or any
    compatible server).

    Raises (from ``__call__``): ``openai.OpenAIError`` when the endpoint fails after the client's
    retries, ``ValueError`` when it answers with the wrong number of vectors.
    """

    def __init__(self, *, base_url: str, api_key: str, model: str, timeout_s: float = 10.0,
                 max_retries: int = 1) -> None:
        self.model = model
        self._client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s, max_retries=max_retries)

    def __call__(self, texts: list[str]) -> list[list[float]]:
        """One vector per text, in order."""
        response = self._client.embeddings.create(model=self.model, input=texts)
        vectors = [item.embedding for item in sorted(response.data, key=lambda item: item.index)]
        if len(vectors) != len(texts):
            raise ValueError(f"embeddings endpoint returned {len(vectors)} vectors for {len(texts)} texts")
        return [list(v) for v in vectors]
