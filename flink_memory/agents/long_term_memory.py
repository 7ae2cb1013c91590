"""flink-memory as Flink Agents' long-term memory (`BaseLongTermMemory` of flink-agents 0.3.1): an agent written
against its memory-set API (`ctx.long_term_memory.get_memory_set(name)`, a set's `add`/`get`/`search`/`delete`)
runs on flink-memory with one line, `use_flink_memory(agent, store=..., input=...)`, on the local runner and
on Flink (docs/flink-agents.md#long-term-memory).

A memory set of a key is one flink-memory agent, `"{key}:{set}"`: its items are the agent's memory units
(written as input records of the running memory job, which stays the store's only writer), `search` is its
hybrid recall (units and summary nodes), and its summary tree is the set's compaction (`FlinkMemorySet.summary`).

How it is installed (0.3.1 builds only Mem0 itself, from `LongTermMemoryOptions.Mem0.*`): `use_flink_memory`
adds to the agent an action of this module that no event triggers, whose config holds
`LongTermMemorySettings`. Flink Agents imports each action's module when it reads the plan (it checks the
action's signature), which on a TaskManager happens before it builds the runner context's long-term memory:
importing this module wraps that builder
(`flink_runner_context._init_long_term_memory`) so it builds ours when the plan has our settings, and gives the
local runner's context (which has none in 0.3.1) a long-term memory.
"""

from __future__ import annotations

from typing import Any

from flink_agents.api.agents.agent import Agent
from flink_agents.api.events.event import Event
from flink_agents.api.memory.long_term_memory import BaseLongTermMemory, MemorySet, MemorySetItem
from flink_agents.api.runner_context import RunnerContext
from flink_agents.runtime import flink_runner_context, local_runner
from flink_agents.runtime.memory.internal_base_long_term_memory import InternalBaseLongTermMemory
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_serializer

from flink_memory.agents.core import AgentScopeError, check_limit, check_question, hit_document
from flink_memory.agents.memory import AgentMemory, load_embedder
from flink_memory.service.models import Mode

INSTALL_ACTION = "flink_memory_long_term_memory"
INSTALL_EVENT = "_flink_memory_long_term_memory_never_sent"
SETTINGS_KEY = "long_term_memory"


class LongTermMemorySettings(BaseModel):
    """Where the memory job's store and input are (as FlinkMemoryVectorStore's fields); in the agent's plan."""

    model_config = ConfigDict(extra="forbid")

    store: str = Field(description="the memory job's store: a SQLite path or postgresql:// URL")
    input: str | None = Field(default=None, description="the job's input for writes (None: read-only)")
    config: str | None = Field(default=None, description="flink-memory config file, for embeddings.*")
    settings: list[str] = Field(default_factory=list, description="config overrides (key=value)")
    mode: Mode = "hybrid"

    @model_serializer(mode="plain")
    def _fields(self) -> dict[str, Any]:
        """Plain fields: the plan is written with serialize_as_any, under which pydantic 2.11 takes a model in
        an action's config for a circular reference."""
        return {name: getattr(self, name) for name in type(self).model_fields}


def _installed(event: Event, ctx: RunnerContext) -> None:
    """The action that carries the settings in the plan; no event triggers it."""


def use_flink_memory(agent: Agent, store: str, input: str | None = None, *, config: str | None = None,
                     settings: list[str] | None = None, mode: Mode = "hybrid") -> Agent:
    """Give `agent` flink-memory as its `ctx.long_term_memory` (instead of Mem0's options); returns the agent."""
    install_hooks()
    agent.add_action(INSTALL_ACTION, [INSTALL_EVENT], _installed, **{SETTINGS_KEY: LongTermMemorySettings(
        store=store, input=input, config=config, settings=list(settings or []), mode=mode)})
    return agent


def settings_in(plan: Any) -> LongTermMemorySettings | None:
    """Our settings in an agent plan, if `use_flink_memory` installed them."""
    action = plan.actions.get(INSTALL_ACTION)
    value = (action.config or {}).get(SETTINGS_KEY) if action is not None else None
    if isinstance(value, (list, tuple)) and len(value) == 3:  # (a plan read where this module was not imported)
        value = value[2]
    return LongTermMemorySettings.model_validate(value) if value is not None else None


class FlinkMemorySet(MemorySet):
    """A memory set whose summary (its compaction) is the current global summary of its tree."""

    def summary(self) -> str | None:
        return self.ltm.summary(self)


FlinkMemorySet.model_rebuild(_types_namespace={"BaseLongTermMemory": BaseLongTermMemory})


class FlinkMemoryLongTermMemory(InternalBaseLongTermMemory):
    """Memory sets of the current key, each one flink-memory agent (`agent_of`)."""

    memory_settings: LongTermMemorySettings
    key: str = Field(default="", description="the key of the action running now (switch_context)")

    _memory: AgentMemory | None = PrivateAttr(default=None)

    @property
    def memory(self) -> AgentMemory:
        if self._memory is None:
            s = self.memory_settings
            embedder = load_embedder(s.config, s.settings) if s.mode != "keyword" else None
            self._memory = AgentMemory(s.store, s.input, embedder=embedder, mode=s.mode)
        return self._memory

    def switch_context(self, key: str) -> None:
        self.key = str(key)

    def agent_of(self, memory_set: MemorySet | str) -> str:
        """The flink-memory agent of a set of the current key."""
        name = memory_set if isinstance(memory_set, str) else memory_set.name
        if not self.key:
            raise AgentScopeError("no key: the long-term memory is read inside an action (of a keyed input)")
        if not name or ":" in name:
            raise AgentScopeError(f"a memory set's name is non-empty and has no ':', got {name!r}")
        return f"{self.key}:{name}"

    def get_memory_set(self, name: str) -> FlinkMemorySet:
        self.agent_of(name)
        return FlinkMemorySet(name=name, ltm=self)

    def delete_memory_set(self, name: str) -> bool:
        self.memory.forget(self.agent_of(name))
        return True

    def add(self, memory_set: MemorySet, memory_items: str | list[str],
            metadatas: dict[str, Any] | list[dict[str, Any]] | None = None) -> list[str]:
        """Each item a memory of the set's agent (an input record of the memory job; its id from the content)."""
        agent = self.agent_of(memory_set)
        items = [memory_items] if isinstance(memory_items, str) else list(memory_items)
        metas = metadatas if isinstance(metadatas, list) else [metadatas] * len(items)
        if len(metas) != len(items):
            raise ValueError(f"{len(items)} items and {len(metas)} metadatas")
        return [self.memory.remember(agent, item, metadata=meta or None).id for item, meta in zip(items, metas)]

    def get(self, memory_set: MemorySet, ids: str | list[str] | None = None,
            filters: dict[str, Any] | None = None, limit: int = 100) -> list[MemorySetItem]:
        """The set's memory items (units), those of `ids` when given, else the first `limit`."""
        if filters:
            raise ValueError("flink-memory's memory sets take no filters: a set is one agent's memory")
        wanted = [ids] if isinstance(ids, str) else ids
        units = self.memory.units(self.agent_of(memory_set), wanted)
        if wanted is None:
            units = units[:limit]
        return [MemorySetItem(memory_set_name=memory_set.name, id=uid, value=text) for uid, text in units]

    def search(self, memory_set: MemorySet, query: str, limit: int, filters: dict[str, Any] | None = None,
               **kwargs: Any) -> list[MemorySetItem]:
        """The set's items and summaries that best answer `query`, best first (`kind` in the metadata)."""
        if filters:
            raise ValueError("flink-memory's memory sets take no filters: a set is one agent's memory")
        agent = self.agent_of(memory_set)
        hits = self.memory.recall(agent, check_question(query), check_limit(limit))
        return [MemorySetItem(memory_set_name=memory_set.name, id=doc.id, value=doc.content,
                              additional_metadata={**doc.metadata, "score": doc.score})
                for doc in (hit_document(agent, hit) for hit in hits)]

    def delete(self, memory_set: MemorySet, ids: str | list[str] | None = None) -> None:
        """Retract items by id; without ids, every item of the set (the set stays, empty)."""
        agent = self.agent_of(memory_set)
        if ids is None:
            self.memory.forget(agent)
            return
        for record_id in [ids] if isinstance(ids, str) else ids:
            self.memory.delete(agent, record_id)

    def summary(self, memory_set: MemorySet) -> str | None:
        """The set's compaction: the current global summary of its tree (None until the job made one)."""
        node = self.memory.summary(self.agent_of(memory_set))
        return node.text if node is not None else None

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None


_hooked = False


def install_hooks() -> None:
    """Flink's runner context builds ours when the plan has our settings (else Mem0, as before); the local
    runner's context, which has no long-term memory in 0.3.1, gets one per key."""
    global _hooked
    if _hooked:
        return
    _hooked = True
    build_mem0 = flink_runner_context._init_long_term_memory

    def init_long_term_memory(ctx: Any, job_id: str) -> Any:
        settings = settings_in(ctx._FlinkRunnerContext__agent_plan)
        return FlinkMemoryLongTermMemory(memory_settings=settings) if settings else build_mem0(ctx, job_id)

    flink_runner_context._init_long_term_memory = init_long_term_memory
    original = local_runner.LocalRunnerContext.long_term_memory

    def local_long_term_memory(self: Any) -> Any:
        settings = settings_in(self._LocalRunnerContext__agent_plan)
        if settings is None:
            return original.fget(self)
        if getattr(self, "_flink_memory_ltm", None) is None:
            self._flink_memory_ltm = FlinkMemoryLongTermMemory(memory_settings=settings)
            self._flink_memory_ltm.switch_context(str(self.key))
        return self._flink_memory_ltm

    local_runner.LocalRunnerContext.long_term_memory = property(local_long_term_memory)


install_hooks()  # (on import: on a TaskManager, reading the plan imports this module)
