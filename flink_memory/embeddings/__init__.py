"""Embedding providers for recall by meaning: an offline CPU model from PyPI (`embedded`) or any
OpenAI-compatible `/v1/embeddings` endpoint (`openai`), behind one `Embedder` that caches vectors by text
digest. `embedder_for(config.embeddings)` picks one (None for `provider: none`).

    from flink_memory.embeddings import embedder_for

    embedder = embedder_for(config.embeddings)
    vectors = embedder.passages(["I adopted a beagle puppy and named it Rex."])
    question = embedder.query("What is the name of my dog?")
"""

from flink_memory.embeddings.core import Embedder, EmbeddingError, embedder_for, from_bytes, to_bytes

__all__ = ["Embedder", "EmbeddingError", "embedder_for", "from_bytes", "to_bytes"]
