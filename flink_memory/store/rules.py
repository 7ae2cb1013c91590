"""The store's rules in plain Python: which nodes are live, how a question becomes a full-text query, how
specificity weighs a match, and the live tree. The SQL stores apply them; tests check them in milliseconds.

Liveness (DESIGN.md): a node is live while no written node lists it in `replaces`. The rule only asks
whether some node replaces it, never in which order nodes arrived, so it is order-independent and a
replayed node changes nothing.

Recall: the engine finds candidate rows (full text: the meaningful terms of the question, OR-ed; vectors:
the nearest), and flink_memory.store.ranking scores them: BM25 with a term weight that never drops to zero,
cosine similarity, their fusion, times SPECIFICITY ** steps, where `steps` counts how far a row is above the
memory units (`specificity_steps`; a unit and a batch node are 0): a batch node outranks its merge as long
as its relevance is at least SPECIFICITY (0.8) of the merge's, and ties go to the lower step.

Memory units are rows of kind `unit` beside the nodes, keyed `unit:<unit id>` (no node id starts so).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

from flink_memory.records import MemoryUnit, SummaryNode

M = TypeVar("M", bound=BaseModel)

SPECIFICITY = 0.8
MAX_TERMS = 32
UNIT_KIND = "unit"
UNIT_PREFIX = "unit:"
UNIT_STEPS = -1  # below the batch nodes: at equal scores a unit comes first

# PostgreSQL's `english` stop list (Snowball), so both stores drop the same words from a question.
STOP_WORDS = frozenset("""
i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she her hers
herself it its itself they them their theirs themselves what which who whom this that these those am is are
was were be been being have has had having do does did doing a an the and but if or because as until while
of at by for with about against between into through during before after above below to from up down in out
on off over under again further then once here there when where why how all any both each few more most
other some such no nor not only own same so than too very s t can will just don should now
""".split())

_WORD = re.compile(r"[^\W_]+")


class StoreError(RuntimeError):
    """The store cannot be used; the message says why."""


class StoreNotFound(StoreError):
    """Nothing (or nothing of ours) at this location yet."""


class PositionConflict(StoreError):
    """Another applier moved an agent's log position meanwhile: nothing was written; read the positions again."""


class RankParts(BaseModel):
    """How a recall hit's score was made: its keyword score (BM25; None in vector mode), its cosine with the
    question (None: no vector, or keyword mode), their fusion (`relevance`: in hybrid mode each part rescaled
    over the candidates, ranking.KEYWORD_WEIGHT of the keyword one) and the factor of its place in the tree
    (SPECIFICITY ** steps; flink_memory.store.ranking); score = relevance x specificity."""

    model_config = ConfigDict(frozen=True)

    keyword: float | None
    cosine: float | None
    relevance: float
    specificity: float


class Recalled(BaseModel):
    """One recall hit and its score (higher is better): a live node (`kind` batch | merge | global), or a
    memory unit (`kind` unit, level 0: `node_id` is the unit id, `covered_by` the batch node that holds it,
    absent until its batch is summarized; `provisional` while its checkpoint has not committed). `first_ts`..
    `last_ts` is the time range covered (a unit: its time). `covered_by` appears in the JSON of unit hits only;
    `folds` names the hits it stands for, left out of the list (flink_memory.store.diversity)."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    kind: str
    level: int
    text: str
    score: float
    first_ts: str | None = None
    last_ts: str | None = None
    covered_by: str | None = None
    provisional: bool = False  # a unit accepted and not committed yet (true appears in the JSON only)
    folds: list[str] = []  # ids of matching units and nodes it shows, left out of the list (diversity)
    parts: RankParts | None = None  # how its score was made (recall's `explain`; appears in the JSON then only)

    @model_serializer(mode="wrap")
    def _without_unit_fields(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if self.kind != UNIT_KIND:
            data.pop("covered_by", None)
        if not self.provisional:
            data.pop("provisional", None)
        if not self.folds:
            data.pop("folds", None)
        if self.parts is None:
            data.pop("parts", None)
        return data

    @classmethod
    def of(cls, node: SummaryNode, score: float) -> Recalled:
        fields = node.model_dump(include={"node_id", "kind", "level", "text", "first_ts", "last_ts"})
        return cls(**fields, score=float(f"{score:.6g}"))


def _parsed(model: type[M], value: M | dict[str, Any] | str | bytes) -> M:
    """A model from itself, its dict, or its JSON."""
    if isinstance(value, model):
        return value
    if isinstance(value, (str, bytes)):
        return model.model_validate_json(value)
    return model.model_validate(value)


def as_node(value: SummaryNode | dict[str, Any] | str | bytes) -> SummaryNode:
    """A node from the model, its dict, or its JSON line (as in summaries/)."""
    return _parsed(SummaryNode, value)


def as_unit(value: MemoryUnit | dict[str, Any] | str | bytes) -> MemoryUnit:
    """A memory unit from the model, its dict, or its JSON."""
    return _parsed(MemoryUnit, value)


def query_terms(question: str) -> list[str]:
    """The meaningful words of a question: letters and digits only (so no text can carry query syntax),
    lower-cased, stop words dropped, first occurrence kept, at most MAX_TERMS."""
    terms: list[str] = []
    for word in _WORD.findall(question.lower()):
        if word not in STOP_WORDS and word not in terms:
            terms.append(word)
    return terms[:MAX_TERMS]


def fts5_query(terms: list[str]) -> str:
    """An FTS5 MATCH expression: any of the terms, each a quoted string (FTS5 escapes `"` by doubling)."""
    return " OR ".join('"' + term.replace('"', '""') + '"' for term in terms)


def tsquery_term(term: str) -> str:
    """One term for PostgreSQL's to_tsquery, quoted so that it is read as a word, never as an operator."""
    return "'" + term.replace("'", "''").replace("\\", "\\\\") + "'"


def specificity_steps(kind: str, level: int) -> int:
    """Steps above the memory units: level - 1 (a batch node is 0), one more for a global node, which covers
    everything below it (a global over batch nodes has level 2, like a merge of a few of them). A unit is
    UNIT_STEPS: scored like a batch node, ahead of it at equal scores."""
    if kind == UNIT_KIND:
        return UNIT_STEPS
    return level - 1 + (1 if kind == "global" else 0)


def live_view(changelog: Iterable[SummaryNode | dict[str, Any] | str]) -> dict[tuple[str, str], SummaryNode]:
    """The live nodes of a changelog (summaries/ lines, in any order), by (agent_id, node_id)."""
    nodes = [as_node(n) for n in changelog]
    replaced = {(n.agent_id, old) for n in nodes for old in n.replaces}
    return {(n.agent_id, n.node_id): n for n in nodes if (n.agent_id, n.node_id) not in replaced}


def walk_tree(root: SummaryNode, children: Callable[[SummaryNode], list[SummaryNode]]
              ) -> list[tuple[int, SummaryNode, int]]:
    """Depth-first (depth, node, children not stored) from `root`; `children` gives a node's stored children."""
    out: list[tuple[int, SummaryNode, int]] = []
    stack = [(0, root)]
    while stack:
        depth, node = stack.pop()
        found = children(node) if node.kind != "batch" else []
        out.append((depth, node, 0 if node.kind == "batch" else len(node.children) - len(found)))
        stack.extend((depth + 1, child) for child in reversed(found))
    return out
