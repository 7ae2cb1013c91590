"""The recall ranking in plain Python: a keyword weight that never drops to zero, cosine, fusion, specificity."""

import random
import re

import pytest

from flink_memory.store.ranking import (
    Candidate,
    TermCounts,
    cosine,
    idf,
    keyword_scores,
    rank,
    stem,
    words,
)
from flink_memory.store.rules import SPECIFICITY, query_terms


def test_a_word_in_every_row_still_counts_so_the_row_holding_both_words_ranks_first():
    texts = [f"Person {i} is allergic to nothing at all, says the allergic list." if i % 2 else
             f"Selquisel met person {i} at the allergic clinic." for i in range(1, 12)]
    texts.append("Selquisel is allergic to peanuts.")
    texts = [t if "allergic" in t else t + " allergic" for t in texts]
    assert all("allergic" in t for t in texts)
    candidates = [Candidate(key=f"r{i}", text=t, steps=0) for i, t in enumerate(texts)]
    assert idf(len(texts), len(texts)) > 0  # FTS5 would clamp this to about zero
    hits = rank(query_terms("Selquisel allergic"), candidates, rows=len(texts), k=3, mode="keyword")
    assert hits[0][0].text == "Selquisel is allergic to peanuts."
    # the rarest word alone would not single it out: several rows name Selquisel
    assert sum("Selquisel" in t for t in texts) > 1


def test_keyword_scores_saturate_and_normalize_length():
    short, long_ = "alice boat", "alice boat " + "filler words here " * 10
    assert keyword_scores(["boat"], [short, long_], rows=2)[0] > keyword_scores(["boat"], [short, long_], rows=2)[1]
    assert keyword_scores(["zebra"], [short], rows=1) == [0.0]
    assert words("The boats, parties and walked!") == ["the", "boat", "party", "and", "walk"]
    assert stem("class") == "class" and stem("dog") == "dog" and stem("1234") == "1234"


def test_cosine_and_vector_mode():
    assert cosine([1, 0], [1, 0]) == pytest.approx(1) and cosine([1, 0], [0, 1]) == 0 and cosine([0, 0], [1, 1]) == 0
    candidates = [Candidate("a", "x", 0, 0.2), Candidate("b", "y", 0, 0.9), Candidate("c", "z", 0, None)]
    assert [c.key for c, _ in rank(["q"], candidates, rows=3, k=5, mode="vector")] == ["b", "a"]


@pytest.mark.parametrize("fusion", ["weighted", "rrf"])
def test_hybrid_combines_both_and_keeps_specificity(fusion):
    candidates = [Candidate("merge-1", "Rex the beagle", 1, 0.80), Candidate("batch-1", "Rex the beagle", 0, 0.80),
                  Candidate("unit-1", "I named my dog Rex", 0, 0.95), Candidate("other", "a cat", 0, 0.10)]
    hits = rank(query_terms("beagle Rex"), candidates, rows=4, k=4, fusion=fusion)
    keys = [c.key for c, _ in hits]
    assert keys.index("batch-1") < keys.index("merge-1") and keys[-1] == "other"
    scores = dict((c.key, s) for c, s in hits)
    assert scores["merge-1"] == pytest.approx(scores["batch-1"] * SPECIFICITY)
    keyword_only = [c.key for c, _ in rank(query_terms("dog"), candidates, rows=4, k=4, mode="keyword")]
    assert keyword_only == ["unit-1"]  # no vectors looked at: only rows sharing a term


def test_term_counts_read_ascii_and_other_text_alike():
    """Lower-case ASCII text is split by a faster pattern: it finds the words the Unicode one does."""
    rng = random.Random(11)
    alphabet = "abcXYZ019 _-'.,é"
    terms = ["abc", "xyz", "zé", "019"]
    for _ in range(500):
        text = "".join(rng.choices(alphabet, k=rng.randrange(40)))
        found = re.findall(r"[^\W_]+", text.lower())
        expected = [sum(1 for w in found if stem(w) == stem(t)) for t in terms]
        assert TermCounts(terms).of(text) == (tuple(expected), len(found)), text
