"""The connection part of a store: one database connection's reads and transactional writes (each dialect
supplies them, with its one transaction: flink_memory.store.sqlite, flink_memory.store.postgres), its SQL
placeholder, the schema check, the agents' generations (every write moves an agent's on, so readers reload
what they cache) and the store's meta values. The other parts take it in their constructors.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from flink_memory.records import SummaryNode
from flink_memory.store.rules import PositionConflict, StoreError, StoreNotFound
from flink_memory.store.schema import BUMP, GENERATION, META_VALUE, SCHEMA, SCHEMA_VERSION

Statements = list[tuple[str, tuple[Any, ...]]]
Checks = list[tuple[str, tuple[Any, ...], list[tuple[Any, ...]]]]


class StoreConnection(ABC):
    """A store's database: abstract reads and writes, and the helpers every part uses."""

    placeholder = "?"
    location: str
    missing_table: tuple[type[Exception], ...] = ()  # what the driver raises for a table that is not there

    @abstractmethod
    def fetch(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def write(self, agents: list[str], statements: Statements, checks: Checks | None = None) -> None:
        """Run the statements in one transaction, holding the write lock of each agent; first each check's
        query must return its rows exactly, else nothing is written (PositionConflict)."""

    @abstractmethod
    def close(self) -> None: ...

    def _checked(self, execute: Callable[[str, tuple[Any, ...]], Any], statements: Statements,
                 checks: Checks | None) -> None:
        """A write's body, inside its transaction (`execute` runs a statement there): each check's query must
        return its rows exactly (else PositionConflict, and the transaction rolls back), then the statements."""
        for sql, params, expected in checks or ():
            found = [tuple(row) for row in execute(sql, params).fetchall()]
            if found != expected:
                raise PositionConflict(f"{self.location}: {params} is at {found}, not {expected}")
        for sql, params in statements:
            execute(sql, params)

    def commit(self, agents: list[str], statements: Statements, checks: Checks | None = None) -> None:
        """`write`, and the agents' generations move on (readers reload their cached vectors)."""
        self.write(agents, statements + [(self.sql(BUMP), (agent,)) for agent in agents], checks)

    def generation(self, agent_id: str) -> int | None:
        """The agent's generation (0: never written); None for a store written before generations."""
        try:
            rows = self.query(GENERATION, (agent_id,))
        except self.missing_table:
            return None
        return int(rows[0][0]) if rows else 0

    def sql(self, statement: str) -> str:
        """A statement written with `?` placeholders, in the dialect's."""
        return statement.replace("?", self.placeholder)

    def query(self, statement: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """`fetch` of a statement written with `?` placeholders."""
        return self.fetch(self.sql(statement), params)

    def bodies(self, statement: str, params: tuple[Any, ...]) -> list[SummaryNode]:
        return [SummaryNode.model_validate_json(row[0]) for row in self.query(statement, params)]

    def meta(self, key: str) -> str | None:
        rows = self.query(META_VALUE, (key,))
        return rows[0][0] if rows else None

    def check_schema(self) -> None:
        """Refuse a database that holds no store, or a store of another schema version."""
        try:
            rows = self.query(SCHEMA, ())
        except self.missing_table:
            raise StoreNotFound(f"{self.location} holds no flink-memory store") from None
        if not rows:
            raise StoreNotFound(f"{self.location} holds no flink-memory store (no schema version)")
        if rows[0][0] != str(SCHEMA_VERSION):
            raise StoreError(f"store schema version {rows[0][0]} at {self.location} is not readable by this "
                             f"release (it reads version {SCHEMA_VERSION})")
