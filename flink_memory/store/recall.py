"""The recall part of a store: the agent's live units and nodes that best match a question, by keyword, by
meaning or both.

The keyword rows come from the dialect's search part (`Search.matching`: SQLite's FTS5, PostgreSQL's tsvector)
while the question is embedded and searched by meaning on the agent's vectors (a reader's cache,
store/vectors.py; PostgreSQL with pgvector searches its index instead); the rows are ranked (store/ranking.py)
and results that only repeat the matching units of results above them give way (store/diversity.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from flink_memory.meanwhile import meanwhile
from flink_memory.store.connection import StoreConnection
from flink_memory.store.diversity import DIVERSITY, WINDOW, Ranked, diversify, stands_for
from flink_memory.store.ranking import Candidate, Fusion, TermCounts, rank
from flink_memory.store.rules import UNIT_KIND, UNIT_PREFIX, RankParts, Recalled, StoreError, query_terms
from flink_memory.store.schema import (
    HIDDEN_KIND,
    HIT,
    HIT_WIDTH,
    NODES,
    PENDING_PREFIX,
    ROWS_OF_AGENT,
    VECTORS_OF_AGENT,
    hit,
)
from flink_memory.store.vector_rows import VectorRows
from flink_memory.store.vectors import VectorCache, cosines, nearest

Mode = Literal["hybrid", "keyword", "vector"]
KEYWORD_CANDIDATES = 400  # rows sharing a term with the question (Search.matching)
VECTOR_CANDIDATES = 50  # nearest rows by cosine

CHILDREN_CACHED_AGENTS = 64  # agents whose nodes' child ids a reader keeps (recall's diversity)
ByMeaning = Callable[[Mapping[str, tuple[Any, ...]]], tuple[dict[str, float], dict[str, tuple[Any, ...]]]]


class Search(Protocol):
    """What a dialect searches where its rows are (flink_memory.store.sqlite, flink_memory.store.postgres)."""

    def matching(self, agent_id: str, terms: list[str], limit: int, *,
                 question: Any | None = None) -> list[tuple[Any, ...]]:
        """HIT columns of the agent's rows holding any of `terms` (full text): all of them when there are at
        most `limit`, else `limit` of those likely to rank best (by the engine's own rank or cheaper). A store
        that scores rows where they are adds each row's distance to the `question`'s vector, when given."""
        ...

    def facts(self, agent_id: str, terms: list[str]) -> tuple[dict[str, str], int | None] | None:
        """The store's record of its model and the agent's generation, read with what the search needs of the
        question's keyword `terms` in one round trip; None: read as any store reads them."""
        ...

    def nearest_meanwhile(self, agent_id: str, question: Callable[[], Any],
                          generation: int | None) -> ByMeaning | None:
        """A search by meaning where the rows are (as `Recaller.nearest_meanwhile`); None: the reader's exact one."""
        ...

    def close(self) -> None: ...


class Recaller:
    """Recall on a connection: keyword rows by the dialect's `search`, vectors by `vectors` (its embedder)."""

    def __init__(self, connection: StoreConnection, vectors: VectorRows, search: Search) -> None:
        self.connection = connection
        self.vectors = vectors
        self.search = search
        self.diversity: float = DIVERSITY  # recall's default weight of distinct results (recall.diversity)
        self.vector_cache: VectorCache | None = None  # this reader's per-agent matrices and row counts
        self._children_cache: dict[tuple[str, int], dict[str, list[str]]] = {}  # (agent, generation): node -> ids

    def recall(self, agent_id: str, query: str, k: int = 5, mode: Mode | None = None,
               fusion: Fusion = "weighted", diversity: float | None = None, explain: bool = False) -> list[Recalled]:
        """The agent's k live units and nodes that best match `query` (natural language), best first.

        `mode`: keyword (full text only), vector (by meaning only) or hybrid (both, fused); None: hybrid
        when the store was opened with an embedder, else keyword. Ranking: flink_memory.store.ranking.
        `diversity` (0..1; None: the store's `diversity`, recall.diversity): how much results that only
        repeat the matching units of results above them give way (flink_memory.store.diversity); a hit
        names those it stands for in `folds`. A question without meaningful words gives []; so does an
        empty memory. `explain`: each hit carries the parts of its score (`parts`)."""
        terms = query_terms(query)
        if not terms or k <= 0:
            return []
        embedder = self.vectors.embedder
        mode = mode or ("hybrid" if embedder is not None else "keyword")
        if mode != "keyword" and embedder is None:
            raise StoreError(f"recall --mode {mode} needs an embedding model (embeddings.provider is none)")
        model, generation = self._recall_facts(agent_id, terms if mode != "vector" else [])
        embedder = embedder if mode != "keyword" else None  # (the question embedded while the store searches:)
        known = embedder is not None and self.vectors.check_model(embedder, record=False, model=model)
        question = embedder.query_meanwhile(query) if embedder is not None and known else None
        try:
            by_meaning = self.nearest_meanwhile(agent_id, question, generation) if question is not None else None
        except BaseException:
            with contextlib.suppress(Exception):
                question()  # (waited for: an embedder is never used by two of its calls at once)
            raise
        counts = TermCounts(terms)
        rows: dict[str, tuple[Any, ...]] = {}
        try:
            if mode != "vector":  # (an inline model's vector is known already: a store may score rows by it)
                ready = question() if question is not None and embedder is not None and embedder.inline else None
                matching = self.search.matching(agent_id, terms, KEYWORD_CANDIDATES, question=ready)
                rows = {row[0]: row for row in matching}
            for row in rows.values() if question is not None else ():
                counts.of(row[4])  # (while the question is embedded and searched)
        finally:
            scores, nearest_rows = by_meaning(rows) if by_meaning is not None else ({}, {})
        rows = {key: row[:HIT_WIDTH] for key, row in rows.items()}  # (a keyword row read with its distance)
        for key, row in nearest_rows.items():
            rows.setdefault(key, row)
        missing = [key for key in sorted(scores, key=lambda key: -scores[key])[:VECTOR_CANDIDATES] if key not in rows]
        if missing:
            sql = f"SELECT {HIT} FROM {NODES} WHERE agent_id = ? AND node_id IN ({', '.join('?' for _ in missing)})"
            rows.update((row[0], row) for row in self.connection.query(sql, (agent_id, *missing)))
        for key in [key for key, row in rows.items() if row[1] == HIDDEN_KIND]:  # (a deletion shown, not committed)
            del rows[key]
        for key in [key for key in rows if key.startswith(PENDING_PREFIX)]:  # (it stands for the committed row)
            rows.pop(UNIT_PREFIX + key.removeprefix(PENDING_PREFIX), None)
        if not rows:
            return []
        self.vector_cache = self.vector_cache or VectorCache()
        query = self.connection.query
        total = self.vector_cache.rows(agent_id, generation, lambda agent: int(query(ROWS_OF_AGENT, (agent,))[0][0]))
        candidates = [Candidate(key=key, text=row[4], steps=row[3], cosine=scores.get(key))
                      for key, row in rows.items()]
        weight = self.diversity if diversity is None else diversity
        parts: dict[str, RankParts] | None = {} if explain else None

        def explained(c: Candidate, score: float) -> Recalled:
            found = hit(rows[c.key], score)
            return found.model_copy(update={"parts": parts[c.key]}) if parts is not None else found

        if weight <= 0:
            ranked = rank(terms, candidates, total, k, mode, fusion, counts=counts, parts=parts)
            return [explained(c, score) for c, score in ranked]
        ranked = rank(terms, candidates, total, k * WINDOW, mode, fusion, counts=counts, parts=parts)
        hits = [explained(c, score) for c, score in ranked]
        by_id = {h.node_id: h for h in hits}
        def terms(candidate: Candidate) -> frozenset[str]:
            if mode != "keyword":
                return frozenset()
            return frozenset(t for t, n in zip(counts.stems, counts.of(candidate.text)[0]) if n)

        chosen = [Ranked(key=h.node_id, unit=h.kind == UNIT_KIND, score=h.score, covered_by=h.covered_by,
                         terms=terms(c)) for h, (c, _) in zip(hits, ranked)]
        chosen = diversify(chosen, stands_for(chosen, lambda ids: self._children(agent_id, generation, ids)), k, weight)
        return [by_id[c.key].model_copy(update={"folds": c.folds}) if c.folds else by_id[c.key] for c in chosen]

    def _recall_facts(self, agent_id: str, terms: list[str]) -> tuple[dict[str, str], int | None]:
        """The store's record of its model (`VectorRows.model`) and the agent's generation, read as a recall
        starts; a search may also learn what it needs of the question's keyword `terms` in the same round trip."""
        facts = self.search.facts(agent_id, terms)
        return facts if facts is not None else (self.vectors.model(), self.connection.generation(agent_id))

    def _children(self, agent_id: str, generation: int | None, node_ids: list[str]) -> dict[str, list[str]]:
        """The child ids of these live nodes (a batch node's are unit ids), kept while the agent's generation
        stays (any write moves it on)."""
        key = (agent_id, generation or 0)
        cached = self._children_cache.get(key) if generation is not None else None
        if cached is None:
            cached = {}
            if generation is not None:
                if len(self._children_cache) >= CHILDREN_CACHED_AGENTS:
                    self._children_cache.pop(next(iter(self._children_cache)))
                self._children_cache[key] = cached
        missing = [n for n in node_ids if n not in cached]
        if missing:
            marks = ", ".join("?" for _ in missing)
            sql = f"SELECT node_id, body FROM {NODES} WHERE agent_id = ? AND node_id IN ({marks}) AND kind <> 'unit'"
            rows = self.connection.query(sql, (agent_id, *missing))
            found = {node_id: json.loads(body)["children"] for node_id, body in rows}
            cached.update({n: found.get(n, []) for n in missing})
        return {n: cached[n] for n in node_ids}

    def nearest_meanwhile(self, agent_id: str, question: Callable[[], Any], generation: int | None) -> ByMeaning:
        """Cosines of the agent's nearest rows, searched exactly on its cached matrix (store/vectors.py) in a
        thread while the caller searches by keyword; the result, given the keyword rows, adds their cosines and
        waits for the search (or raises what it raised), with the HIT rows it found that the caller lacks (none
        here: the caller reads them). The caller calls it, also on errors. `generation`: the agent's, read as
        the recall started (what the cached matrix is kept by). The dialect's search may search where the rows
        are instead (`Search.nearest_meanwhile`)."""
        by_meaning = self.search.nearest_meanwhile(agent_id, question, generation)
        if by_meaning is not None:
            return by_meaning
        self.vector_cache = self.vector_cache or VectorCache()
        query = self.connection.query
        vectors = self.vector_cache.vectors(agent_id, generation, lambda agent: query(VECTORS_OF_AGENT, (agent,)))

        def search() -> tuple[Any, list[int]]:
            vector = question()
            return vector, nearest(vectors, vector, VECTOR_CANDIDATES)

        found = meanwhile(search, name="recall-by-meaning", started=False)  # (the keyword search goes first)

        def result(rows: Mapping[str, tuple[Any, ...]]) -> tuple[dict[str, float], dict[str, tuple[Any, ...]]]:
            vector, near = found()
            return cosines(vectors, vector, near, rows), {}

        return result
