"""What every part of the store runs on: one connection's reads and transactional writes (each store supplies
them: flink_memory.store.sqlite, flink_memory.store.postgres), its SQL placeholder, the agents' generations
(every write moves an agent's on, so readers reload what they cache) and the store's meta values.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from flink_memory.records import SummaryNode
from flink_memory.store.schema import BUMP, GENERATION, META_VALUE


class StoreConnection(ABC):
    """The backend half of a store: abstract reads, writes and keyword search; the helpers every part uses."""

    placeholder = "?"
    location: str
    missing_table: tuple[type[Exception], ...] = ()  # what the driver raises for a table that is not there

    @abstractmethod
    def _fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def _write(self, agents: list[str], statements: list[tuple[str, tuple[Any, ...]]],
               checks: list[tuple[str, tuple[Any, ...], list[tuple[Any, ...]]]] = ()) -> None:  # type: ignore[assignment]
        """Run the statements in one transaction, holding the write lock of each agent; first each check's
        query must return its rows exactly, else nothing is written (PositionConflict)."""

    @abstractmethod
    def _matching(self, agent_id: str, terms: list[str], limit: int, *,
                  question: Any | None = None) -> list[tuple[Any, ...]]:
        """HIT columns of the agent's rows holding any of `terms` (full text): all of them when there are at
        most `limit`, else `limit` of those likely to rank best (by the engine's own rank or cheaper). A store
        that scores rows where they are adds each row's distance to the `question`'s vector, when given."""

    @abstractmethod
    def close(self) -> None: ...

    def _commit(self, agents: list[str], statements: list[tuple[str, tuple[Any, ...]]],
                checks: list[tuple[str, tuple[Any, ...], list[tuple[Any, ...]]]] = ()) -> None:  # type: ignore[assignment]
        """`_write`, and the agents' generations move on (readers reload their cached vectors)."""
        self._write(agents, statements + [(self._sql(BUMP), (agent,)) for agent in agents], checks)

    def _generation(self, agent_id: str) -> int | None:
        """The agent's generation (0: never written); None for a store written before generations."""
        try:
            rows = self._fetch(self._sql(GENERATION), (agent_id,))
        except self.missing_table:
            return None
        return int(rows[0][0]) if rows else 0

    def _sql(self, statement: str) -> str:
        return statement.replace("?", self.placeholder)

    def _bodies(self, sql: str, params: tuple[Any, ...]) -> list[SummaryNode]:
        return [SummaryNode.model_validate_json(row[0]) for row in self._fetch(self._sql(sql), params)]

    def _meta(self, key: str) -> str | None:
        rows = self._fetch(self._sql(META_VALUE), (key,))
        return rows[0][0] if rows else None
