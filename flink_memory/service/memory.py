"""What the service does, in plain Python: the HTTP API and the MCP tools are two doors to these methods.

Reads go to the store; writes become input records of the running job (flink_memory.service.writer), each
validated exactly as the job validates its input (`parse_line`): what the job would dead-letter is refused
here with the job's reason. An agent the caller's key does not grant is answered exactly like an agent that
does not exist (`NotFound`, one message for both), so a key cannot learn which agents exist.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from flink_memory.records import DeadLetter, SummaryNode, parse_line
from flink_memory.service.models import (
    ACCEPTED_DETAIL,
    Accepted,
    AgentsResponse,
    AgentStore,
    ApplierLag,
    ChildrenResponse,
    Health,
    HistoryEvent,
    HistoryResponse,
    MemoryResponse,
    RecallRequest,
    RecallResponse,
    TreeEntry,
    TreeItem,
)
from flink_memory.service.pool import PoolBusy, StorePool, default_size
from flink_memory.service.writer import RecordTooLarge, RecordWriter, WriteFailed, as_line
from flink_memory.store import MemoryStore, StoreError, StoreNotFound, open_store
from flink_memory.store.diversity import DIVERSITY
from flink_memory.store.rules import walk_tree

if TYPE_CHECKING:
    from flink_memory.embeddings import Embedder


class ServiceError(Exception):
    """An answer other than success; `status` is its HTTP status, the message its readable reason."""

    status = 500


class NotFound(ServiceError):
    status = 404

    def __init__(self, agent_id: str) -> None:
        super().__init__(f"no memory for agent {agent_id!r}")


class Rejected(ServiceError):
    """A request the job would not accept (its dead-letter reason), or one this server cannot answer."""

    status = 422


class ReadOnly(ServiceError):
    status = 403


class TooLarge(ServiceError):
    status = 413


class Unavailable(ServiceError):
    status = 503


class NotCreated(Unavailable):
    """The store does not exist yet: the job creates it when it first writes (no agent has memory yet)."""


class NodeNotFound(ServiceError):
    status = 404


def tree_item(node: SummaryNode) -> TreeItem:
    return TreeItem(node_id=node.node_id, kind=node.kind, level=node.level, version=node.version,
                    item_count=node.item_count, first_ts=node.first_ts, last_ts=node.last_ts, text=node.text,
                    children=len(node.children), replaces=node.replaces)


def ancestors(node_id: str, parents: dict[str, str]) -> list[str]:
    """The ids above `node_id`, from the top down (`parents`: child id -> parent id)."""
    path: list[str] = []
    at = parents.get(node_id)
    while at is not None and at not in path:
        path.append(at)
        at = parents.get(at)
    return path[::-1]


class Grant(Protocol):
    def allows(self, agent_id: str) -> bool: ...


class Everyone:
    """The grant of a server without --keys (loopback only): every agent."""

    def allows(self, agent_id: str) -> bool:
        return True


class OneAgent:
    """A grant of one agent alone: `serve --stdio --agent A`, and each call of the Flink Agents bridge."""

    def __init__(self, agent_id: str) -> None:
        self.agent_id = agent_id

    def allows(self, agent_id: str) -> bool:
        return agent_id == self.agent_id

    def default_agent(self) -> str:
        return self.agent_id


class MemoryService:
    """A pool of store connections (flink_memory.service.pool: opened when first needed, the job may not
    have created the store yet) and one writer (None: read-only). Safe to call from many threads: at most
    `threads` reads run at once (default: one more than the CPU cores), the others wait their turn."""

    def __init__(self, store_url: str, writer: RecordWriter | None = None, *, embedder: Embedder | None = None,
                 read_only: bool = False, threads: int | None = None, diversity: float = DIVERSITY,
                 applier_warn_after_s: float = 120.0) -> None:
        self.store_url = store_url
        self.applier_warn_after_s = applier_warn_after_s  # health is degraded once a commit waits this long
        self.writer = None if read_only else writer
        self.embedder = embedder
        self.diversity = diversity  # recall's weight of distinct results when a request names none
        self._pool = StorePool(lambda: open_store(store_url, embedder=embedder), threads or default_size())

    # --- plumbing ------------------------------------------------------------------------------------

    @contextmanager
    def store(self) -> Iterator[MemoryStore]:
        """A store connection of the pool for this caller alone, while the block runs."""
        try:
            with self._pool.lend() as store:
                yield store
        except StoreNotFound as exc:
            raise NotCreated(f"{exc} yet: the job creates it when it first writes") from None
        except PoolBusy as exc:
            raise Unavailable(str(exc)) from None
        except StoreError as exc:
            raise Unavailable(str(exc)) from None

    @contextmanager
    def _agent(self, grant: Grant, agent_id: str) -> Iterator[MemoryStore]:
        """A store, when `agent_id` is granted and has memory; otherwise NotFound (the same for both)."""
        if not grant.allows(agent_id):
            raise NotFound(agent_id)
        with self.store() as store:
            if not store.has_agent(agent_id):
                raise NotFound(agent_id)
            yield store

    def close(self) -> None:
        self._pool.close()
        if self.writer is not None:
            self.writer.close()

    def health(self) -> Health:
        lag = None
        try:
            with self.store() as store:
                state = "ok"
                lag = store.applier_lag()
        except Unavailable as exc:
            state = str(exc)
        applier = None if lag is None else ApplierLag.of(lag, time.time())
        behind = applier is not None and applier.oldest_unapplied_age_s > self.applier_warn_after_s
        return Health(status="ok" if state == "ok" and not behind else "degraded", store=state,
                      writes=self.writer.target if self.writer is not None else "read-only",  # type: ignore[arg-type]
                      applier=applier)

    # --- reads ---------------------------------------------------------------------------------------

    def memory(self, grant: Grant, agent_id: str, tree: bool = False) -> MemoryResponse:
        """The agent's current global summary, and with `tree` the live tree below it."""
        with self._agent(grant, agent_id) as store:
            current = store.current(agent_id)
            entries = None
            if tree and current is not None:
                walked = walk_tree(current, lambda n: store.children(agent_id, n.node_id))
                entries = [TreeEntry(depth=d, node=n, missing_children=m) for d, n, m in walked]
        return MemoryResponse(agent_id=agent_id, memory=current, tree=entries)

    def recall(self, grant: Grant, agent_id: str, request: RecallRequest) -> RecallResponse:
        """The agent's live units and nodes that best match the question."""
        with self._agent(grant, agent_id) as store:
            mode = request.mode
            if self.embedder is None and mode == "hybrid":
                mode = "keyword"
            if self.embedder is None and mode == "vector":
                raise Rejected("recall by meaning is off on this server (embeddings.provider: none); use mode keyword")
            diversity = self.diversity if request.diversity is None else request.diversity
            hits = store.recall(agent_id, request.question, k=request.k, mode=mode, diversity=diversity,
                                explain=request.explain)
            paths = None
            if request.explain:
                parents = store.parents(agent_id)
                paths = {h.node_id: ancestors(h.node_id, parents) for h in hits}
        return RecallResponse(hits=hits, paths=paths)

    # --- reads for the browser page (flink_memory.service.page) -------------------------------------------

    def agents(self, grant: Grant) -> AgentsResponse:
        """The agents with memory that the key may read."""
        with self.store() as store:
            return AgentsResponse(agents=[a for a in store.agents() if grant.allows(a)])

    def children(self, grant: Grant, agent_id: str, node_id: str, offset: int = 0, limit: int = 100
                 ) -> ChildrenResponse:
        """One page of a live node's children: nodes, or a batch node's memory units."""
        with self._agent(grant, agent_id) as store:
            node = store.node(agent_id, node_id)
            if node is None:
                raise NodeNotFound(f"no live node {node_id!r} in the memory of agent {agent_id!r}")
            ids = node.children[offset:offset + limit]
            if node.kind == "batch":
                items = [TreeItem(node_id=u.unit_id, kind="unit", level=0, item_count=1, first_ts=u.ts,
                                  last_ts=u.ts, text=u.text, children=0, provisional=pending)
                         for u, _covered_by, pending in store.units_by_id(agent_id, ids)]
            else:
                wanted = set(ids)
                items = [tree_item(n) for n in store.children(agent_id, node_id) if n.node_id in wanted]
        return ChildrenResponse(agent_id=agent_id, node_id=node_id, total=len(node.children), offset=offset,
                                children=items, missing=len(ids) - len(items))

    def history(self, grant: Grant, agent_id: str, offset: int = 0, limit: int = 100) -> HistoryResponse:
        """A page of the agent's live units and nodes over time, newest first, with what changed marked."""
        with self._agent(grant, agent_id) as store:
            rows, total = store.timeline(agent_id, offset, limit)
            replaced = store.replaced_count(agent_id)
        events = []
        for row in rows:
            marks = (["remade"] if row["replaces"] else []) + (["provisional"] if row["provisional"] else [])
            if row["kind"] == "global" and row["item_count"] == 0:
                marks.append("forgotten")
            events.append(HistoryEvent(**row, children=0, marks=marks))
        return HistoryResponse(agent_id=agent_id, total=total, offset=offset, events=events, replaced=replaced)

    def agent_store(self, grant: Grant, agent_id: str) -> AgentStore:
        """The store's facts about the agent: rows, vectors and their model, the log positions applied."""
        with self._agent(grant, agent_id) as store:
            rows, embedded = store.agent_vectors(agent_id)
            model = store.vectors.model()
            merger, batcher = store.log_position(agent_id)
        dim = model.get("embedding_dim")
        return AgentStore(agent_id=agent_id, rows=rows, rows_with_vectors=embedded,
                          embedding_model=model.get("embedding_model"), embedding_dim=int(dim) if dim else None,
                          merger_seq=merger, batcher_seq=batcher)

    # --- writes: input records for the job --------------------------------------------------------------

    def _send(self, grant: Grant, agent_id: str, record: dict[str, Any]) -> Accepted:
        """Validate a record as the job does, then hand it to the job's input."""
        if not grant.allows(agent_id):
            raise NotFound(agent_id)
        if self.writer is None:
            raise ReadOnly("this server is read-only: it does not write to the job's input")
        line = as_line(record)
        parsed = parse_line(line)
        if isinstance(parsed, DeadLetter):
            raise Rejected(parsed.reason)
        try:
            line.encode("utf-8")
        except UnicodeEncodeError as exc:  # a "\ud800" escape: valid JSON, but no UTF-8 line can hold it
            raise Rejected(f"a string holds a lone surrogate ({line[exc.start]!r}): not writable as UTF-8") from None
        try:
            self.writer.write(agent_id, line)
        except RecordTooLarge as exc:
            raise TooLarge(str(exc)) from None
        except WriteFailed as exc:
            raise Unavailable(str(exc)) from None
        return Accepted(id=getattr(parsed, "id", agent_id), kind=parsed.kind, detail=ACCEPTED_DETAIL)

    def remember(self, grant: Grant, agent_id: str, body: bytes | str | dict[str, Any]) -> Accepted:
        """A new memory (or an update of one, by its id): an input record without agent_id, raw or parsed."""
        if not isinstance(body, dict):
            try:
                body = json.loads(body)
            except RecursionError:
                raise Rejected("invalid JSON: nested too deeply") from None
            except ValueError as exc:
                raise Rejected(f"invalid JSON: {exc}") from None
            if not isinstance(body, dict):
                raise Rejected(f"a record must be a JSON object, got {type(body).__name__}")
        if "agent_id" in body:
            raise Rejected("agent_id: comes from the path (or the key), not from the record")
        for change in ("deleted", "forget"):
            if change in body:
                raise Rejected(f"{change}: a deletion or forget is a DELETE request (or the forget_memory tool)")
        record_id = body.get("id")
        if record_id is None:
            record_id = f"mem-{uuid.uuid4().hex}"
        record = {"agent_id": agent_id, **body, "id": record_id}
        if record.get("metadata") is None:
            record.pop("metadata", None)
        if record.get("ts") is None:
            record.pop("ts", None)
        return self._send(grant, agent_id, record)

    def delete(self, grant: Grant, agent_id: str, record_id: str) -> Accepted:
        """Retract one record (its units leave the store and every summary once the job applies it)."""
        return self._send(grant, agent_id, {"agent_id": agent_id, "id": record_id, "deleted": True})

    def forget(self, grant: Grant, agent_id: str) -> Accepted:
        """Drop everything of the agent."""
        return self._send(grant, agent_id, {"agent_id": agent_id, "forget": True})
