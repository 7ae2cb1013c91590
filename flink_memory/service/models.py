"""The service's request and answer bodies: pydantic models, so the HTTP API validates them and its OpenAPI
document describes them, and the MCP tools answer the same shapes.

Limits keep every request cheap to answer: a question of at most MAX_QUESTION characters, at most MAX_K hits.
A write body (`RememberRequest`) is the job's input record without `agent_id` (the path names the agent);
its content rules are the job's own (`flink_memory.records.parse_line`), so a record the job would
dead-letter is refused with the job's reason.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from flink_memory.ids import RECORD_ID_PATTERN
from flink_memory.records import Message, SummaryNode
from flink_memory.store import Recalled
from flink_memory.store.lag import Lag

MAX_QUESTION = 2000
MAX_K = 100
MAX_BODY_BYTES = 1 << 20
MAX_PAGE = 500  # children or history entries in one answer

Mode = Literal["hybrid", "keyword", "vector"]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecallRequest(_Body):
    question: str = Field(min_length=1, max_length=MAX_QUESTION, description="a question or keywords")
    k: int = Field(5, ge=1, le=MAX_K, description="how many units and nodes")
    mode: Mode = Field("hybrid", description="keyword, by meaning (vector) or both (hybrid); hybrid is keyword "
                                             "on a server without embeddings")
    diversity: float | None = Field(None, ge=0.0, le=1.0, description=(
        "how much results that repeat the matching memories of results above them give way (0: relevance "
        "alone; 1: no slot; a hit names those it stands for in folds); default: the server's recall.diversity"))
    explain: bool = Field(False, description="each hit with the parts of its score (`parts`: keyword, cosine, "
                                             "relevance, specificity) and the answer with each hit's `paths`")


class RecallResponse(_Body):
    hits: list[Recalled]
    paths: dict[str, list[str]] | None = Field(None, description=(
        "with explain: where each hit sits in the tree, by hit id: the ids from the global down to its parent "
        "(a unit's last is its batch node; [] for a node no stored node lists)"))

    @model_serializer(mode="wrap")
    def _without_paths(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self.paths is None:
            data.pop("paths", None)
        return data


class AgentsResponse(_Body):
    agents: list[str] = Field(description="the agents with memory in the store that the key may read, sorted")


class TreeItem(_Body):
    """One node of the live tree, or one memory unit under a batch node (kind `unit`, level 0)."""

    node_id: str = Field(description="the node id, or a unit's id")
    kind: Literal["unit", "batch", "merge", "global"]
    level: int
    version: int | None = None
    item_count: int = Field(description="memory units covered")
    first_ts: str | None = None
    last_ts: str | None = None
    text: str
    children: int = Field(description="ids one level down (a batch node's: its units)")
    replaces: list[str] = Field(default_factory=list, description="node ids this node was made again in place of")
    provisional: bool = Field(False, description="a unit shown before its checkpoint commits")


class ChildrenResponse(_Body):
    agent_id: str
    node_id: str
    total: int = Field(description="the node's child ids (a page of them is in `children`)")
    offset: int
    children: list[TreeItem] = Field(description="the stored children of ids offset..offset+limit, in order")
    missing: int = Field(description="ids of this page not stored (a retention mode, or a unit not applied yet)")


class HistoryEvent(TreeItem):
    covered_by: str | None = Field(None, description="a unit's batch node (none: not summarized yet)")
    marks: list[str] = Field(description="what changed: remade (an update, deletion or new unit below a node made "
                                         "it again), forgotten (a global of an emptied memory), provisional")


class HistoryResponse(_Body):
    agent_id: str
    total: int = Field(description="the agent's live units and nodes")
    offset: int
    events: list[HistoryEvent] = Field(description="newest first: by the end of the time each covers, then id")
    replaced: int = Field(description="nodes of the agent that later nodes replaced (their text is gone)")


class AgentStore(_Body):
    """The store as the service sees it, for one agent."""

    agent_id: str
    rows: int = Field(description="the agent's rows: live units and nodes (with provisional and hidden ones)")
    rows_with_vectors: int
    embedding_model: str | None = Field(description="the model of the store's vectors (none: no vectors yet)")
    embedding_dim: int | None = None
    merger_seq: int = Field(description="the last entry of the agent's merger log the store applied (its commits)")
    batcher_seq: int = Field(description="the last entry of the agent's batcher log the store applied")


class TreeEntry(_Body):
    depth: int
    node: SummaryNode
    missing_children: int = Field(description="children a retention mode did not store")


class MemoryResponse(_Body):
    agent_id: str
    memory: SummaryNode | None = Field(description="the current global summary (null: none yet)")
    tree: list[TreeEntry] | None = Field(None, description="with ?tree=true: the live tree below it, depth first")


# What the job accepts as a record id, for the OpenAPI document (the job's own check decides: parse_line):
# not blank, no control characters, not ending in '#' and digits (the ids of a record's parts)
RecordId = Annotated[str, Field(min_length=1, max_length=512, json_schema_extra={"pattern": RECORD_ID_PATTERN})]
Timestamp = Annotated[str, Field(json_schema_extra={"format": "date-time"}, description="RFC 3339 with offset")]


class _Remember(_Body):
    id: RecordId | None = Field(None, description="unique per agent; the same id with new content is an update "
                                                  "(default: a new random id)")
    ts: Timestamp | None = None
    metadata: dict[str, Any] | None = None


class RememberText(_Remember):
    """A fact, a note or a document."""

    text: Annotated[str, Field(min_length=1, json_schema_extra={"pattern": r"\S"})]


class RememberConversation(_Remember):
    """A conversation; a long one is cut into topic chunks."""

    messages: list[Message] = Field(min_length=1)


class RememberTrusted(_Remember):
    """A conversation the sender already cut into chunks."""

    trusted: Literal[True]
    chunks: list[Annotated[list[Message], Field(min_length=1)]] = Field(min_length=1)


# The body of POST .../memories: an input record without agent_id. It documents the shapes only: the body is
# checked by the job's own rules (parse_line), never by these models.
RememberRequest = RememberText | RememberConversation | RememberTrusted


class Accepted(_Body):
    id: str = Field(description="the record id (a deletion: the id deleted)")
    kind: Literal["item", "conversation", "trusted", "deletion", "forget"]
    status: Literal["accepted"] = "accepted"
    detail: str = Field(description="when a reader sees it")


class ApplierLag(_Body):
    """How far the store is behind the job's committed memory log, as its applier last recorded it."""

    log: str = Field(description="the memory log the applier follows")
    written: int = Field(description="commits (committed files) the job wrote to the log")
    applied: int = Field(description="of them, applied to the store")
    unapplied: int
    oldest_unapplied_age_s: float = Field(description="age of the oldest commit not applied yet (0: none)")
    polled_age_s: float | None = Field(description="seconds since the applier last looked at the log")

    @classmethod
    def of(cls, lag: Lag, now: float) -> ApplierLag:
        return cls(log=lag.log, written=lag.written, applied=lag.applied, unapplied=lag.unapplied,
                   oldest_unapplied_age_s=round(lag.oldest_unapplied_age_s(now), 3),
                   polled_age_s=round(max(0.0, now - lag.polled_at), 3) if lag.polled_at is not None else None)


class Health(_Body):
    status: Literal["ok", "degraded"] = Field(description="degraded: the store cannot be read, or a committed "
                                              "change has waited longer than store.applier_warn_after_s")
    store: str = Field(description="ok, or why the store cannot be read yet")
    writes: Literal["directory", "kafka", "read-only"]
    applier: ApplierLag | None = Field(None, description="the store applier's lag (null: no applier has written "
                                       "this store yet)")


class Problem(_Body):
    detail: str


ACCEPTED_DETAIL = ("handed to the running job: its memory units are searchable once the job's batcher accepts "
                   "them (seconds), its summaries once their batch is summarized (batching.flush_after_s at most)")
