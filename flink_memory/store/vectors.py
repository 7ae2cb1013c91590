"""Vector search per agent from a matrix kept in memory, reloaded only when the agent's rows changed.

Reading an agent's vectors from the database costs far more than the search itself (100 000 rows: about a
second from SQLite, a few milliseconds as one matrix product), so a reader keeps each agent's matrix and the
store's generation of that agent (`flink_memory_generations`, bumped by every write that touches the agent,
in the same transaction). A recall reads the generation (one indexed row) and reloads only when it moved.

An agent's search reads its whole matrix (100 000 rows of 256 dimensions: 100 MB, 5-10 ms on this
machine's cores), which is most of a recall. Above SHORTLIST_ABOVE rows it reads their signs first: one bit
per dimension (3 MB), compared by Hamming distance with the question's, which picks a shortlist of
SHORTLIST_FACTOR x the rows asked for; the shortlist's cosines are then computed exactly. The rows a recall
returns are ranked by exact cosines either way; what the shortlist can miss is a row whose signs differ from
the question's more than its cosine says (benchmarks/recall_latency.py measures how often).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

MAX_AGENTS = 16  # agents whose matrices a reader keeps (least recently used leave first)
SHORTLIST_ABOVE = 20_000  # rows of an agent above which its search starts from the rows' signs
SHORTLIST_FACTOR = 160  # rows compared exactly per row asked for (top-5 agreement with an exact search: 0.998)


@dataclass
class AgentVectors:
    generation: int | None
    keys: list[str]
    index: dict[str, int]
    matrix: np.ndarray
    signs: np.ndarray | None = None  # (dim / 64, rows) uint64: the rows' sign bits, above SHORTLIST_ABOVE rows

    @classmethod
    def of(cls, generation: int | None, keys: list[str], matrix: np.ndarray,
           shortlist_above: int = SHORTLIST_ABOVE) -> AgentVectors:
        """The agent's rows with what a search derives from them: the index by key and, for more than
        `shortlist_above` rows, their sign bits word by word (each word of every row contiguous)."""
        import numpy as np

        signs = np.ascontiguousarray(sign_bits(matrix).T) if len(keys) > shortlist_above else None
        return cls(generation, keys, {key: i for i, key in enumerate(keys)}, matrix, signs)


class VectorCache:
    """Per-agent matrices of one reader; `load(agent)` reads (key, vector bytes) rows from the store. Also
    each agent's row count (the keyword score's N), which costs a scan of the agent's index entries."""

    def __init__(self, max_agents: int = MAX_AGENTS) -> None:
        self.max_agents = max_agents
        self._agents: OrderedDict[str, AgentVectors] = OrderedDict()
        self._rows: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._rows_lock = threading.Lock()  # (keyword recalls of a store may run in many threads at once)

    def rows(self, agent_id: str, generation: int | None, count: Callable[[str], int]) -> int:
        """The agent's row count, counted again only when its generation moved."""
        with self._rows_lock:
            cached = self._rows.get(agent_id)
            if cached is not None and generation is not None and cached[0] == generation:
                self._rows.move_to_end(agent_id)
                return cached[1]
        counted = count(agent_id)
        if generation is not None:
            with self._rows_lock:
                self._rows[agent_id] = (generation, counted)
                while len(self._rows) > self.max_agents:
                    self._rows.popitem(last=False)
        return counted

    def vectors(self, agent_id: str, generation: int | None,
                load: Callable[[str], list[tuple[str, bytes]]]) -> AgentVectors:
        import numpy as np  # (loaded by the first recall by meaning, not by every reader of the store)

        cached = self._agents.get(agent_id)
        if cached is not None and generation is not None and cached.generation == generation:
            self._agents.move_to_end(agent_id)
            return cached
        found = load(agent_id)
        keys = [key for key, _ in found]
        matrix = (np.frombuffer(b"".join(bytes(v) for _, v in found), dtype="<f4").reshape(len(found), -1)
                  if found else np.zeros((0, 0), dtype="<f4"))
        loaded = AgentVectors.of(generation, keys, matrix)
        if generation is not None:  # (a store without generations: nothing tells when to reload)
            self._agents[agent_id] = loaded
            while len(self._agents) > self.max_agents:
                self._agents.popitem(last=False)
        return loaded


def sign_bits(matrix: np.ndarray) -> np.ndarray:
    """Each row's signs, one bit per dimension, packed into uint64 words (the dimension padded to 64)."""
    import numpy as np

    bits = np.packbits(matrix > 0, axis=-1)
    padding = (-bits.shape[-1]) % 8
    if padding:
        bits = np.pad(bits, [(0, 0)] * (bits.ndim - 1) + [(0, padding)])
    return np.ascontiguousarray(bits).view(np.uint64)


def nearest(vectors: AgentVectors, question: np.ndarray, count: int) -> list[int]:
    """The rows of the `count` largest cosines with the (unit) question, in no order. Matrix products
    release the GIL (a recall runs this while the store searches by keyword)."""
    import numpy as np

    rows = len(vectors.keys)
    if rows <= count:
        return list(range(rows))
    if vectors.signs is not None and rows > SHORTLIST_FACTOR * count:
        asked = sign_bits(question[None, :])[0]
        differ = np.bitwise_count(vectors.signs[0] ^ asked[0]).astype(np.uint16)  # (word by word: contiguous)
        for word in range(1, len(asked)):
            differ += np.bitwise_count(vectors.signs[word] ^ asked[word])
        # the shortlist: every row within the Hamming distance that SHORTLIST_FACTOR x count rows reach
        reach = int(np.searchsorted(np.cumsum(np.bincount(differ)), SHORTLIST_FACTOR * count))
        shortlist = np.flatnonzero(differ <= reach)
        scores = vectors.matrix[shortlist] @ question
        return shortlist[np.argpartition(scores, len(scores) - count)[-count:]].tolist()
    scores = vectors.matrix @ question
    return np.argpartition(scores, rows - count)[-count:].tolist()


def cosines(vectors: AgentVectors, question: np.ndarray, rows: list[int], also: Iterable[str]) -> dict[str, float]:
    """Exact cosines of `rows` (from `nearest`) and of the rows `also` names, by key."""
    picked = list(dict.fromkeys([*rows, *(i for i in (vectors.index.get(key) for key in also) if i is not None)]))
    if not picked:
        return {}
    return dict(zip([vectors.keys[i] for i in picked], exact_cosines(vectors.matrix[picked], question)))


def exact_cosines(matrix: np.ndarray, question: np.ndarray) -> list[float]:
    """Each row's cosine with the (unit) question as a reader's matrix gives it: in float64, rounded to 10
    decimals, so that a row's cosine does not depend on where it sits in a matrix (float32 sums do, by the
    BLAS kernel's blocking) and rows tied in exact arithmetic stay tied (the ranking orders them by key)."""
    import numpy as np

    return np.round(matrix.astype(np.float64) @ question.astype(np.float64), 10).tolist()
