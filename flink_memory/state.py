"""Typed keyed state: named value and map states behind one small interface, for one activation at a time.

Every stage declares its states in a `StateSchema` (name -> how each is stored: a stored model of
flink_memory.state_layout, value or map). The Flink shell maps each name to a PyFlink ValueState or MapState
of JSON text; tests use `MemoryState`. Both go through `StateTransaction`, which hands the core domain objects,
reads through, keeps writes until the activation succeeded, and commits them at once: an activation that
raises leaves the key's state as it found it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel

from flink_memory.state_layout import Codec

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


class Value(str, Generic[T]):
    """The name of a value state whose domain objects are T: a string to schemas, backends and checkpoints, and
    to the type checker what `StateTransaction.get` returns."""


class Entries(str, Generic[T]):
    """The name of a map state whose entries' domain objects are T (what `StateTransaction.entry` returns)."""


# --- schema and stores ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateSchema:
    """The named states of one stage, each with how it is stored (None: raw text)."""

    values: dict[str, Codec | None] = field(default_factory=dict)
    maps: dict[str, Codec | None] = field(default_factory=dict)
    # value states that stay absent for a key once found absent (an older layout's, only ever cleared): a
    # backend may remember that instead of reading them again
    read_once: frozenset[str] = frozenset()


def seq_key(seq: int) -> str:
    """A map key for a sequence number: the map's sorted keys are then in sequence order."""
    return f"{seq:012d}"


class Migration(Protocol):
    """How a stage's state of an older layout becomes the current one (flink_memory.migrations), as each key
    is loaded; the topology names it per stage and the driver runs it."""

    def schema(self, current: StateSchema) -> StateSchema:
        """The stage's schema with the older states the migration reads."""

    def migrate(self, core: Any, state: StateTransaction) -> None:
        """Move what the key holds in an older layout into the current one (before the core sees it)."""


class StateBackend(Protocol):
    """Raw text per name (and map key) for the current key: PyFlink states, or dicts in tests."""

    def read(self, name: str) -> str | None: ...

    def write(self, name: str, raw: str | None) -> None: ...

    def read_entry(self, name: str, key: str) -> str | None: ...

    def write_entry(self, name: str, key: str, raw: str | None) -> None: ...

    def write_entries(self, name: str, entries: dict[str, str]) -> None:
        """Store several entries of one map (one call into the JVM where the backend can)."""

    def keys(self, name: str) -> list[str]: ...


class StateTransaction:
    """Typed view of one key's state for one activation; writes reach the backend only on `commit`."""

    def __init__(self, schema: StateSchema, backend: StateBackend, key: str) -> None:
        self.schema = schema
        self.backend = backend
        self.key = key  # the agent whose state this is
        self._values: dict[str, Any] = {}
        self._entries: dict[tuple[str, str], Any] = {}
        self._dirty_values: set[str] = set()
        self._dirty_entries: set[tuple[str, str]] = set()

    # values
    def get(self, name: Value[T]) -> T | None:
        """The value, as the domain object its stored model converts to (raw text for a state stored as text)."""
        if name not in self._values:
            raw = self.backend.read(name)
            stored = self.schema.values[name]
            self._values[name] = raw if raw is None or stored is None else stored.load(raw)
        return self._values[name]

    def set(self, name: Value[T], value: T | None) -> None:
        self._values[name] = value
        self._dirty_values.add(name)

    # maps
    def entry(self, name: Entries[T], key: str) -> T | None:
        slot = (name, key)
        if slot not in self._entries:
            raw = self.backend.read_entry(name, key)
            stored = self.schema.maps[name]
            self._entries[slot] = raw if raw is None or stored is None else stored.load(raw)
        return self._entries[slot]

    def put(self, name: Entries[T], key: str, value: T | None) -> None:
        """Store (or with None, remove) one map entry."""
        self._entries[(name, key)] = value
        self._dirty_entries.add((name, key))

    def keys(self, name: str) -> list[str]:
        """The map's keys, sorted (pending writes included)."""
        found = set(self.backend.keys(name))
        for (map_name, key), value in self._entries.items():
            if map_name == name and (name, key) in self._dirty_entries:
                (found.add if value is not None else found.discard)(key)
        return sorted(found)

    def items(self, name: Entries[T]) -> Iterator[tuple[str, T]]:
        for key in self.keys(name):
            yield key, self.entry(name, key)  # type: ignore[misc]  (a listed key has an entry)

    def clear_map(self, name: str) -> None:
        for key in self.keys(name):
            self.put(name, key, None)

    def commit(self) -> None:
        for name in self._dirty_values:
            value, stored = self._values[name], self.schema.values[name]
            self.backend.write(name, value if value is None or stored is None else stored.dump(value))
        written: dict[str, dict[str, str]] = {}
        for name, key in self._dirty_entries:
            value, stored = self._entries[(name, key)], self.schema.maps[name]
            if value is None:
                self.backend.write_entry(name, key, None)
            else:
                written.setdefault(name, {})[key] = value if stored is None else stored.dump(value)
        for name, entries in written.items():  # one call for a batch's worth of entries
            self.backend.write_entries(name, entries)
        self._dirty_values.clear()
        self._dirty_entries.clear()


class MemoryState:
    """A StateBackend of dicts for many keys: what the stage-core tests and the restore tests run on."""

    def __init__(self) -> None:
        self.current_key = ""
        self.values: dict[tuple[str, str], str] = {}
        self.maps: dict[tuple[str, str], dict[str, str]] = {}

    def read(self, name: str) -> str | None:
        return self.values.get((self.current_key, name))

    def write(self, name: str, raw: str | None) -> None:
        if raw is None:
            self.values.pop((self.current_key, name), None)
        else:
            self.values[(self.current_key, name)] = raw

    def read_entry(self, name: str, key: str) -> str | None:
        return self.maps.get((self.current_key, name), {}).get(key)

    def write_entry(self, name: str, key: str, raw: str | None) -> None:
        entries = self.maps.setdefault((self.current_key, name), {})
        if raw is None:
            entries.pop(key, None)
        else:
            entries[key] = raw

    def write_entries(self, name: str, entries: dict[str, str]) -> None:
        for key, raw in entries.items():
            self.write_entry(name, key, raw)

    def keys(self, name: str) -> list[str]:
        return list(self.maps.get((self.current_key, name), {}))

    def size(self, key: str) -> int:
        """Bytes of one key's state (for bounded-state tests)."""
        total = sum(len(v) for (k, _), v in self.values.items() if k == key)
        return total + sum(len(e) + len(v) for (k, _), m in self.maps.items() if k == key for e, v in m.items())
