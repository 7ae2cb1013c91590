"""Results that cover distinct memory: a covering rule over the summary tree, weighed like maximal marginal
relevance, in plain Python (both stores use it).

A hit stands for memory units that matched the question: a unit for itself, a summary node for the matching units
below it (the candidate units whose batch node is the node or one of its descendants). Hits are taken greedily,
best marginal score first, where a hit's marginal score is its relevance times `1 - weight * r`, and `r` the share
of the units it stands for that the hits already taken stand for. A summary whose matching units is one candidate
unit scoring at least EXPLAINS of it is shown as that unit (the same memory in one slot, as its original text); a
summary of several matching units takes one slot for them all. A hit whose units are all shown already takes no
slot at weight 1 (below 1 it is only ranked lower). A node with no matching unit below it (it matched on its own
summary: a period, a person, a theme) adds what no unit holds and keeps its place. With weight 0 the ranking is
relevance alone.

A hit that was left out for repeating one taken before is named in that hit's `folds`, so nothing found is
hidden: the unit is one `children` call away, the node one `node` call away.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flink_memory.store.rules import SPECIFICITY

DIVERSITY = 1.0  # the default weight (recall.diversity in conf/flink-memory.yaml)
WINDOW = 4  # how many times k ranked candidates the selection looks at
EXPLAINS = SPECIFICITY  # a unit scoring this share of its summary's score explains the summary's match


@dataclass
class Ranked:
    """One ranked hit: its key (a unit id, or a node id), whether it is a unit, its relevance, and for a unit
    the batch node covering it (None: not summarized yet)."""

    key: str
    unit: bool
    score: float
    covered_by: str | None = None
    folds: list[str] = field(default_factory=list)
    terms: frozenset[str] = frozenset()  # the question's terms it holds (keyword recall only; else empty)


def stands_for(hits: Sequence[Ranked], children: Callable[[list[str]], dict[str, list[str]]]
               ) -> dict[str, frozenset[str]]:
    """The matching units each hit stands for. `children(node_ids)` gives nodes' child ids (a batch node's
    are unit ids); it is asked level by level for the nodes below the hits, down to the batch nodes."""
    units = {h.key: h for h in hits if h.unit}
    by_batch: dict[str, set[str]] = {}
    for unit in units.values():
        if unit.covered_by is not None:
            by_batch.setdefault(unit.covered_by, set()).add(unit.key)
    out: dict[str, frozenset[str]] = {key: frozenset([key]) for key in units}
    nodes = [h.key for h in hits if not h.unit]
    if not nodes or not by_batch:
        return {**out, **{key: frozenset() for key in nodes}}
    below: dict[str, set[str]] = {key: set() for key in nodes}  # node -> the batch nodes under it (or itself)
    frontier: dict[str, str] = {key: key for key in nodes}  # a node to expand -> the hit it is under
    for _ in range(16):  # (a tree is a few levels deep; the bound only guards against a cycle)
        if not frontier:
            break
        known = children(sorted(set(frontier)))
        following: dict[str, str] = {}
        for node_id, hit in frontier.items():
            if node_id in by_batch:
                below[hit].add(node_id)
            for child in known.get(node_id, []):
                if child in by_batch:
                    below[hit].add(child)
                elif child not in units:  # (a unit child: the node is a batch node, handled above)
                    following[child] = hit
        frontier = following
    for key in nodes:
        out[key] = frozenset(u for batch in below[key] for u in by_batch[batch])
    return out


def _explaining(node: Ranked, units: set[str] | frozenset[str], left: list[Ranked]) -> list[Ranked]:
    """The node's one unshown matching unit when it explains the node's relevance (a candidate scoring at least
    EXPLAINS of the node, or, by keyword, holding every question term the node holds): the same memory in one
    slot, as its original text. Else [] and the node keeps its
    place: it stands for several matching units in one slot, or it matched beyond them (by the meaning of its
    summary)."""
    found = [u for u in left if u.unit and u.key in units]
    if len(units) != 1 or len(found) != 1:
        return []
    holds_its_terms = bool(node.terms) and found[0].terms >= node.terms  # (keyword: every term the node matched)
    return found if holds_its_terms or found[0].score >= EXPLAINS * node.score else []


def diversify(ranked: Sequence[Ranked], covers: dict[str, frozenset[str]], k: int, weight: float) -> list[Ranked]:
    """The k hits of best marginal score (see the module), each with the hits it folds."""
    if weight <= 0:
        return list(ranked[:k])
    left = list(ranked)
    shown: set[str] = set()
    taken: list[Ranked] = []

    def marginal(hit: Ranked) -> float:
        mine = covers.get(hit.key, frozenset())
        return hit.score * (1 - weight * (len(mine & shown) / len(mine))) if mine else hit.score

    def take(hit: Ranked) -> None:
        taken.append(hit)
        shown.update(covers.get(hit.key, frozenset()))

    while left and len(taken) < k:
        hit = left.pop(max(range(len(left)), key=lambda i: (marginal(left[i]), -i)))
        mine = covers.get(hit.key, frozenset())
        if mine and mine <= shown:  # it repeats what is shown: no slot with the covering rule at full weight
            if weight >= 1:
                next(t for t in taken if mine & covers.get(t.key, frozenset())).folds.append(hit.key)
                continue
        elif not hit.unit and (units := _explaining(hit, mine - shown, left)):
            units[0].folds.append(hit.key)  # a summary of matching units shown as the units themselves
            for unit in units[: k - len(taken)]:
                left.remove(unit)
                take(unit)
            continue
        take(hit)
    return taken
