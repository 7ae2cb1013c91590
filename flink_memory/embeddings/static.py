"""The embedded provider's default model: e5 distilled into a static table (flink_memory.embeddings.distill).

A text's vector is the normalized sum of its words' rows, each row already weighted by how rare its word is;
a word the table does not hold (a name, a code, a number) adds the rows of its e5 pieces. Looking rows up is
the whole cost (tens of thousands of passages per second on one core), so the vectors follow the stream and a
question costs microseconds. Questions and passages share one vector (a table has no prefixes), and there is
no cache: a lookup would cost as much as the vector.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from flink_memory.embeddings.api import Embedder, EmbeddingError, normalized

MODEL = "e5-static"
WORD = re.compile(r"[^\W_]+")  # (flink_memory.embeddings.distill.WORD: the rows were made for these words)
SPLIT_WORDS = 200_000  # unknown words whose pieces are remembered (a stream repeats its names and codes)


class StaticE5(Embedder):
    inline = True

    def __init__(self, batch_size: int = 1024, data: Path | None = None) -> None:
        """`data`: a folder the distillation wrote (default: the one in this package)."""
        super().__init__(batch_size=batch_size, cache_size=0)
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise EmbeddingError(f"embeddings.model {MODEL} needs the tokenizers package: pip install "
                                 "'flink-memory[embeddings]' (or set embeddings.provider: none)") from None
        folder: Any = data if data is not None else resources.files("flink_memory.embeddings").joinpath("data")
        with resources.as_file(folder.joinpath(f"{MODEL}.rows.npy")) as rows:
            self._table = np.load(rows, mmap_mode="r")  # (int8, mapped: a process loads only the rows it reads)
        with folder.joinpath(f"{MODEL}.scales.npy").open("rb") as stream:
            self._scales = np.load(stream)
        self._pieces = Tokenizer.from_str(folder.joinpath(f"{MODEL}.tokenizer.json").read_text(encoding="utf-8"))
        meta = json.loads(folder.joinpath(f"{MODEL}.json").read_text(encoding="utf-8"))
        first = 1 + int(meta["pieces"])  # rows: the unknown piece, the pieces, then the words
        self._words: dict[str, tuple[int, ...]] = {w: (first + i,) for i, w in enumerate(meta["words"])}
        self._split: dict[str, tuple[int, ...]] = {}
        self.dim = int(self._table.shape[1])
        self.name = f"{MODEL}:{len(self._words)}w{meta['pieces']}p{self.dim}"

    def _rows(self, word: str) -> tuple[int, ...]:
        rows = self._words.get(word.lower())
        if rows is None:
            rows = self._split.get(word)
            if rows is None:
                if len(self._split) >= SPLIT_WORDS:
                    self._split.clear()
                rows = self._split[word] = tuple(self._pieces.encode(word, add_special_tokens=False).ids)
        return rows

    def _embed(self, texts: list[str], query: bool) -> np.ndarray:
        ids: list[int] = []
        starts = np.empty(len(texts), dtype=np.int64)
        for k, text in enumerate(texts):
            starts[k] = len(ids)
            for word in WORD.findall(text):
                ids.extend(self._rows(word))
        rows = np.zeros((len(ids) + 1, self.dim), dtype=np.float32)  # (a zero row ends it)
        np.multiply(self._table[ids], self._scales[ids, None], out=rows[:-1])
        sums = np.add.reduceat(rows, starts, axis=0)
        sums[np.diff(np.append(starts, len(ids))) == 0] = 0.0  # (reduceat gives an empty text its start's row)
        return sums

    def _vectors(self, texts: Sequence[str], query: bool) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = np.concatenate([normalized(self._embed(texts[i:i + self.batch_size], query))
                              for i in range(0, len(texts), self.batch_size)])
        with self._lock:
            self.embedded += len(texts)
        return out

    def query_meanwhile(self, text: str) -> Callable[[], np.ndarray]:
        vector = self.query(text)  # (microseconds: no thread to hide it behind)
        return lambda: vector
