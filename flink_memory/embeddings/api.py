"""The embedder every provider shares: L2-normalized float32 vectors, batches of `batch_size`, and a cache
by text digest so a replay or a repeated text does not pay twice.

A provider supplies `_embed(texts, query)`: its own query/passage conventions (e5's "query: " and
"passage: " prefixes) are applied there. `name` identifies model and conventions: the store records it with
the dimension, and refuses vectors of another name (vectors of different models are not comparable).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import numpy as np

from flink_memory.digests import digest_parts
from flink_memory.meanwhile import meanwhile

CACHE_SIZE = 20_000


class EmbeddingError(RuntimeError):
    """Vectors cannot be made (provider missing, endpoint failing); the message says why."""


def to_bytes(vector: np.ndarray) -> bytes:
    """A vector as the store keeps it: little-endian float32."""
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4")


def normalized(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return matrix / np.where(norms > 0, norms, 1.0)


class Embedder(ABC):
    """Texts to unit vectors, cached by (query or passage, text digest). Safe to call from several threads:
    the cache is locked, the provider's `_embed` is not (it must be safe to run concurrently)."""

    name: str
    dim: int
    inline = False  # fast enough for a writer to embed its rows inside its own write (the static model)

    def __init__(self, batch_size: int = 32, cache_size: int = CACHE_SIZE) -> None:
        self.batch_size = batch_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # the cache's; a provider's _embed may run in several threads at once
        self.embedded = 0  # texts sent to the model (cache misses)
        self.model_calls = 0  # model calls (a question's vector shares one with the questions that wait beside it)
        self._questions: list[tuple[str, Future[np.ndarray]]] = []
        self._embedding_questions = False

    @abstractmethod
    def _embed(self, texts: list[str], query: bool) -> np.ndarray:
        """One batch: a (len(texts), dim) array, the provider's conventions applied."""

    def _vectors(self, texts: Sequence[str], query: bool) -> np.ndarray:
        kind = "q" if query else "p"
        keys = [digest_parts((kind, t)) for t in texts]
        with self._lock:
            found = {key: self._cache[key] for key in keys if key in self._cache}
        missing = list(dict.fromkeys(t for t, key in zip(texts, keys) if key not in found))
        for start in range(0, len(missing), self.batch_size):
            batch = missing[start:start + self.batch_size]
            if query and len(batch) == 1:
                found.update(self._remember(batch, self._question(batch[0])[None, :], query))
            else:
                found.update(self._remember(batch, self._counted(batch, query), query))  # (the model unlocked)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, key in enumerate(keys):
            out[i] = found[key]
        with self._lock:
            for key in keys:
                if key in self._cache:
                    self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return out

    def _counted(self, texts: list[str], query: bool) -> np.ndarray:
        with self._lock:
            self.model_calls += 1
        return self._embed(texts, query)

    def _question(self, text: str) -> np.ndarray:
        """One question's raw vector. Questions that arrive while the model embeds others (a service's
        concurrent recalls) wait and go to the model together in its next call: one call per wave, not
        one per question. The thread that finds the model idle embeds every waiting question."""
        mine: Future[np.ndarray] = Future()
        with self._lock:
            self._questions.append((text, mine))
            if self._embedding_questions:
                leader = False
            else:
                leader = self._embedding_questions = True
        if not leader:
            return mine.result()
        while True:
            with self._lock:
                wave, self._questions = self._questions[:self.batch_size], self._questions[self.batch_size:]
                if not wave:
                    self._embedding_questions = False
                    break
            try:
                vectors = self._counted([t for t, _ in wave], True)
            except BaseException as exc:  # every question of the wave sees the model's error
                for _, future in wave:
                    future.set_exception(exc)
            else:
                for (_, future), vector in zip(wave, vectors):
                    future.set_result(vector)
        return mine.result()

    def _remember(self, batch: list[str], embedded: np.ndarray, query: bool) -> dict[str, np.ndarray]:
        """Check, normalize and cache what `_embed` returned for `batch`; the vectors by cache key."""
        vectors = normalized(embedded)
        if vectors.shape != (len(batch), self.dim):
            raise EmbeddingError(f"{self.name}: expected {len(batch)} vectors of {self.dim} dimensions, got "
                                 f"{vectors.shape}")
        made = {digest_parts(("q" if query else "p", text)): vector for text, vector in zip(batch, vectors)}
        with self._lock:
            self.embedded += len(batch)
            self._cache.update(made)
        return made

    def passages(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors of stored texts (memory units, summaries): (len(texts), dim)."""
        return self._vectors(texts, query=False)

    def query(self, text: str) -> np.ndarray:
        """The vector of a question: (dim,)."""
        return self._vectors([text], query=True)[0]

    def query_meanwhile(self, text: str) -> Callable[[], np.ndarray]:
        """`query(text)` computed while the caller goes on: the model runs in a thread (a model's engine and
        an HTTP request release the GIL), which this returns once it is about to call the model. Calling the
        result waits for the vector (or raises what the model raised). A caller calls it before it returns,
        also on errors, so that the embedder is never used by two of its calls at once."""
        if self.inline or digest_parts(("q", text)) in self._cache:
            return lambda: self.query(text)
        vector = meanwhile(lambda: self._question(text)[None, :], name="embed-question")

        def result() -> np.ndarray:
            self._remember([text], vector(), True)
            return self.query(text)

        return result
