"""Typed keyed state: versioned pydantic models in named value and map states, behind one small interface.

Every stage declares its states in a `StateSchema` (name -> model, value or map). The Flink shell maps each
name to a PyFlink ValueState or MapState of JSON text; tests use `MemoryState`. Both go through
`StateTransaction`, which reads through, keeps writes until the activation succeeded, and commits them at
once: an activation that raises leaves the key's state as it found it.

Layouts: version 2 is one JSON object per model with `"v": 2`. Version 1 is moved into it by
`flink_memory.migrations` (through `legacy` and `legacy_entries`); any other version is refused with a
clear reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

STATE_VERSION = 2
LEGACY_VERSION = 1

M = TypeVar("M", bound=BaseModel)
_CURRENT = f'{{"v":{STATE_VERSION},'  # how dump_model starts every value it writes


class StateVersionError(RuntimeError):
    """Stored operator state this release cannot read (another release's layout, or not our envelope)."""


class StateModel(BaseModel):
    """Base of every model kept in keyed state; `v` names the layout that wrote it."""

    model_config = ConfigDict(extra="forbid")

    v: int = STATE_VERSION


def load_model(model: type[M], raw: str) -> M:
    """Parse one stored value; a value of another layout version stops with the reason, never misreads."""
    if raw.startswith(_CURRENT):  # the common case, parsed in one pass; anything else gets the careful path
        try:
            return model.model_validate_json(raw)
        except ValidationError:
            pass
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise StateVersionError(f"operator state is not JSON ({exc}); it was not written by flink-memory") from None
    version = data.get("v") if isinstance(data, dict) else None
    if version != STATE_VERSION:
        raise StateVersionError(
            f"operator state version {version!r} of {model.__name__} is not readable by this release (it reads "
            f"version {STATE_VERSION}, and migrates version {LEGACY_VERSION} on restore): restore with the release "
            "that wrote the checkpoint, or start without --restore")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise StateVersionError(f"operator state of {model.__name__} does not parse: {exc}") from None


def dump_model(value: BaseModel) -> str:
    return value.model_dump_json()


# --- schema and stores ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StateSchema:
    """The named states of one stage. A map whose model is None holds raw text (e.g. verified manifests)."""

    values: dict[str, type[BaseModel]] = field(default_factory=dict)
    maps: dict[str, type[BaseModel] | None] = field(default_factory=dict)
    legacy_values: tuple[str, ...] = ()  # version-1 value states, read once per key for migration
    legacy_entries: Mapping[str, Callable[[str], BaseModel]] = field(default_factory=dict)  # map -> converter


def seq_key(seq: int) -> str:
    """A map key for a sequence number: the map's sorted keys are then in sequence order."""
    return f"{seq:012d}"


@dataclass(frozen=True)
class Migration:
    """How one stage's release 0.1.0 state becomes the current layout."""

    migrate: Callable[[Any, StateTransaction], None]  # (core, state): moves the old values, clears them
    values: tuple[str, ...] = ()  # the old value states
    entries: Mapping[str, Callable[[str], BaseModel]] = field(default_factory=dict)  # map -> bare-string entry

    def schema(self, current: StateSchema) -> StateSchema:
        """The stage's schema with the old states it reads."""
        return replace(current, legacy_values=self.values, legacy_entries=self.entries)


class StateBackend(Protocol):
    """Raw text per name (and map key) for the current key: PyFlink states, or dicts in tests."""

    def read(self, name: str) -> str | None: ...

    def write(self, name: str, raw: str | None) -> None: ...

    def read_entry(self, name: str, key: str) -> str | None: ...

    def write_entry(self, name: str, key: str, raw: str | None) -> None: ...

    def write_entries(self, name: str, entries: dict[str, str]) -> None:
        """Store several entries of one map (one call into the JVM where the backend can)."""

    def keys(self, name: str) -> list[str]: ...


_ABSENT = object()


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
    def get(self, name: str, model: type[M]) -> M | None:
        if name not in self._values:
            raw = self.backend.read(name)
            self._values[name] = None if raw is None else load_model(model, raw)
        return self._values[name]

    def set(self, name: str, value: BaseModel | None) -> None:
        self._values[name] = value
        self._dirty_values.add(name)

    def legacy(self, name: str) -> str | None:
        """A version-1 value of this key. A backend may say it has none without reading (`read_legacy`)."""
        read_legacy = getattr(self.backend, "read_legacy", None)
        return read_legacy(name, self.key) if read_legacy is not None else self.backend.read(name)

    def clear_legacy(self, name: str) -> None:
        self._values[name] = None
        self._dirty_values.add(name)

    # maps
    def entry(self, name: str, key: str) -> Any:
        slot = (name, key)
        if slot not in self._entries:
            raw = self.backend.read_entry(name, key)
            model = self.schema.maps[name]
            if raw is None or model is None:
                self._entries[slot] = raw
            elif name in self.schema.legacy_entries and not raw.startswith('{"v":'):  # (a bare version-1 value)
                self._entries[slot] = self.schema.legacy_entries[name](raw)
            else:
                self._entries[slot] = load_model(model, raw)
        return self._entries[slot]

    def put(self, name: str, key: str, value: Any) -> None:
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

    def items(self, name: str) -> Iterator[tuple[str, Any]]:
        for key in self.keys(name):
            yield key, self.entry(name, key)

    def clear_map(self, name: str) -> None:
        for key in self.keys(name):
            self.put(name, key, None)

    def commit(self) -> None:
        for name in self._dirty_values:
            value = self._values[name]
            self.backend.write(name, None if value is None else dump_model(value))
        stored: dict[str, dict[str, str]] = {}
        for name, key in self._dirty_entries:
            value = self._entries[(name, key)]
            if value is None:
                self.backend.write_entry(name, key, None)
            else:
                stored.setdefault(name, {})[key] = value if isinstance(value, str) else dump_model(value)
        for name, entries in stored.items():  # one call for a batch's worth of entries
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
