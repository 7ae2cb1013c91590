"""Recall ranking in plain Python: a keyword score, vector similarity and their fusion, over candidate rows.

The stores only find candidates (rows that share a term with the question, rows whose vectors are nearest)
and give each its cosine (pgvector's, in float32, or a reader's matrix, in float64: equal to about 1e-7);
every score is computed here, so SQLite and PostgreSQL rank the same rows alike (rows whose cosines differ by
less may change places).

Keyword score: BM25 with Lucene's inverse document frequency `log(1 + (N - n + 0.5) / (n + 0.5))`, which
stays positive for a word in most rows (FTS5's bm25 clamps it to about zero, so a two-word question
collapsed to its rarest word), and the usual term-frequency saturation (K1) and length normalization (B).
`N` is the agent's row count, `n` the rows among the candidates that hold the term.

Fusion: weighted (default, the better one on benchmarks/recall.py): each score divided by the best of its
kind among the candidates, then `KEYWORD_WEIGHT * keyword + (1 - KEYWORD_WEIGHT) * vector`, the vector
part being the cosine rescaled over the candidates' range. Reciprocal rank fusion (`rrf`) is kept for
comparison. Specificity: the fused score is multiplied by SPECIFICITY ** steps (steps above the memory
units; units and batch nodes are 0), and ties go to the lower step, so a unit or a batch node comes before
the merge that covers it at similar scores.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from flink_memory.store.rules import SPECIFICITY, RankParts

K1, B = 1.2, 0.75
RRF_K = 60
KEYWORD_WEIGHT = 0.5
Fusion = Literal["weighted", "rrf"]

_WORD = re.compile(r"[^\W_]+")
_ASCII_WORD = re.compile(r"[a-z0-9]+")  # (_WORD in lower-case ASCII text, read 2.5 times as fast)


@lru_cache(maxsize=1 << 16)  # (a store's rows repeat their words: a lookup costs far less than stripping)
def stem(word: str) -> str:
    """A light English suffix stripper (plurals, -ing, -ed), the same for questions and rows."""
    if len(word) <= 3 or word.isdigit():
        return word
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            return word[: len(word) - len(suffix)] + keep
    return word


def words(text: str) -> list[str]:
    """Every word of a text, lower-cased and stemmed (stop words kept: they only add length)."""
    return [stem(w) for w in _WORD.findall(text.lower())]


@dataclass(frozen=True, slots=True)  # (slots: one object a candidate, not two, for the collector to trace)
class Candidate:
    """One row a store found for a question: its key, text, steps above the units and cosine (None: no
    vector yet, or no vector search)."""

    key: str
    text: str
    steps: int
    cosine: float | None = None


def idf(rows: int, holding: int) -> float:
    """Lucene's BM25 inverse document frequency: positive however common the term."""
    return math.log(1 + (rows - holding + 0.5) / (holding + 0.5))


class TermCounts:
    """How often each question stem is in a text, and the text's length in words, counted once per text: a
    recall counts its keyword candidates while the question is being embedded, the rows found by vector after."""

    def __init__(self, terms: Sequence[str]) -> None:
        self.stems = list(dict.fromkeys(stem(t) for t in terms))
        self._place = {term: i for i, term in enumerate(self.stems)}
        self._starts = tuple(term[:-1] for term in self.stems)  # what a word stemming to a term starts with
        self._counted: dict[str, tuple[tuple[int, ...], int]] = {}

    def of(self, text: str) -> tuple[tuple[int, ...], int]:
        counted = self._counted.get(text)
        if counted is None:
            lower = text.lower()
            found = (_ASCII_WORD if lower.isascii() else _WORD).findall(lower)
            tf = [0] * len(self.stems)
            for word in found:  # (only a word starting like a term is stemmed)
                if word.startswith(self._starts) and (i := self._place.get(stem(word))) is not None:
                    tf[i] += 1
            counted = self._counted[text] = (tuple(tf), len(found))  # (a tuple of ints: the collector drops it)
        return counted


def keyword_scores(terms: Sequence[str], texts: Sequence[str], rows: int,
                   counts: TermCounts | None = None) -> list[float]:
    """BM25 of each text for the question terms (already query_terms'd); `rows` is the agent's row count;
    `counts`: the terms' TermCounts, when some texts are counted already."""
    counts = counts or TermCounts(terms)
    if not texts or not counts.stems:
        return [0.0] * len(texts)
    counted = [counts.of(text) for text in texts]
    average = sum(length for _, length in counted) / len(counted) or 1.0
    weights = [idf(max(rows, len(texts)), sum(1 for tf, _ in counted if tf[i])) for i in range(len(counts.stems))]
    scores = []
    for tf, length in counted:
        score = 0.0
        for weight, n in zip(weights, tf):
            if n:
                score += weight * n * (K1 + 1) / (n + K1 * (1 - B + B * length / average))
        scores.append(score)
    return scores


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def _factor(steps: int) -> float:
    return SPECIFICITY ** max(steps, 0)


def _normalized(values: list[float | None]) -> list[float]:
    """Each value rescaled to [0, 1] over the present ones (None: 0)."""
    present = [v for v in values if v is not None]
    if not present:
        return [0.0] * len(values)
    low, high = min(present), max(present)
    span = high - low
    return [0.0 if v is None else (v - low) / span if span > 1e-12 else 1.0 for v in values]


def _ranks(values: list[float | None]) -> list[int | None]:
    present = {i: v for i, v in enumerate(values) if v is not None and v > 0}
    order = sorted(present, key=lambda i: -present[i])
    ranks: list[int | None] = [None] * len(values)
    for place, i in enumerate(order, 1):  # equal values share a rank
        previous = order[place - 2] if place > 1 else None
        ranks[i] = ranks[previous] if previous is not None and values[previous] == values[i] else place
    return ranks


def rank(terms: Sequence[str], candidates: Sequence[Candidate], rows: int, k: int,
         mode: Literal["hybrid", "keyword", "vector"] = "hybrid", fusion: Fusion = "weighted",
         keyword_weight: float = KEYWORD_WEIGHT, counts: TermCounts | None = None,
         parts: dict[str, RankParts] | None = None) -> list[tuple[Candidate, float]]:
    """The k best candidates with their scores (higher is better), best first; candidates that match in
    neither way (no shared term, no vector) are left out. `counts`: as keyword_scores. `parts`, when given, is
    filled with how each returned candidate's score was made (key -> RankParts)."""
    unique = list({c.key: c for c in candidates}.values())
    keyword = (keyword_scores(terms, [c.text for c in unique], rows, counts) if mode != "vector"
               else [0.0] * len(unique))
    vector = [c.cosine for c in unique] if mode != "keyword" else [None] * len(unique)
    if mode == "keyword":
        fused = keyword
    elif mode == "vector":
        fused = [-1.0 if v is None else (v + 1) / 2 for v in vector]  # cosine in [-1, 1] -> [0, 1]
    elif fusion == "rrf":
        fused = [sum(1 / (RRF_K + r) for r in ranks if r is not None)
                 for ranks in zip(_ranks(list(keyword)), _ranks(vector))]
    else:
        best = max(keyword, default=0.0)
        scaled = [s / best if best > 0 else 0.0 for s in keyword]
        if all(v is None for v in vector):
            fused = scaled
        else:
            fused = [keyword_weight * s + (1 - keyword_weight) * v for s, v in zip(scaled, _normalized(vector))]
    found = [(c, f * _factor(c.steps)) for c, f, kw, v in zip(unique, fused, keyword, vector)
             if kw > 0 or v is not None]
    found.sort(key=lambda pair: (-pair[1], pair[0].steps, pair[0].key))
    if parts is not None:
        place = {c.key: i for i, c in enumerate(unique)}
        for c, _ in found[:k]:
            i = place[c.key]
            parts[c.key] = RankParts(keyword=round(keyword[i], 6) if mode != "vector" else None,
                                     cosine=None if vector[i] is None else round(vector[i], 6),
                                     relevance=round(fused[i], 6), specificity=round(_factor(c.steps), 6))
    return found[:k]
