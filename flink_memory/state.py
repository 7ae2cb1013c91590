"""Typed keyed state: versioned stored models in named value and map states, behind one small interface.

Every stage declares its states in a `StateSchema` (name -> stored model, value or map). A stored model
(`StateModel`) is the checkpoint layout only: plain data that converts field by field to the domain object
the core works with and back, so a domain type can change while checkpoints keep their names. The Flink
shell maps each name to a PyFlink ValueState or MapState of JSON text; tests use `MemoryState`. Both go
through `StateTransaction`, which reads through, keeps writes until the activation succeeded, and commits
them at once: an activation that raises leaves the key's state as it found it.

Layouts: version 2 is one JSON object per model with `"v": 2`. An older layout is moved into it by the
stage's `Migration` (flink_memory.migrations), which the topology hands to the driver; any other version is
refused with a clear reason.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

STATE_VERSION = 2

M = TypeVar("M", bound=BaseModel)
_CURRENT = f'{{"v":{STATE_VERSION},'  # how every stored value this layout writes starts


class StateVersionError(RuntimeError):
    """Stored operator state this release cannot read (another release's layout, or not our envelope)."""


_STORED: dict[type[BaseModel], type[StoredModel]] = {}  # domain type -> its stored model
_setattr = object.__setattr__


def _construct(cls: type[M], values: dict[str, Any]) -> M:
    """A model from every one of its fields, unvalidated (they come from a validated model)."""
    model = cls.__new__(cls)
    _setattr(model, "__dict__", values)
    _setattr(model, "__pydantic_fields_set__", set(values))
    _setattr(model, "__pydantic_extra__", None)
    _setattr(model, "__pydantic_private__", None)
    return model


def _holds_stored(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, StoredModel):
        return True
    return any(_holds_stored(arg) for arg in typing.get_args(annotation))


def _to_domain(value: Any) -> Any:
    if isinstance(value, StoredModel):
        return value.to_domain()
    if isinstance(value, list):
        return [_to_domain(item) for item in value]
    return value


def _to_stored(value: Any) -> Any:
    stored = _STORED.get(type(value))
    if stored is not None:
        return stored.of(value)
    if isinstance(value, list):
        return [_to_stored(item) for item in value]
    return value


class StoredModel(BaseModel):
    """Stored data that converts field by field to a domain type: a `StateModel`, or a part of one (kept inside
    it, without a version of its own).

    `stores` is the domain type (a plain pydantic model; None: read as it is), converted under the same field
    names except those in `renamed` (domain field -> stored field). Fields that hold stored models (also in
    lists and optionals) convert in turn. A stored model that does not name every field of its domain type, or
    names one it lacks, is refused when its module loads.
    """

    stores: ClassVar[type[BaseModel] | None] = None
    renamed: ClassVar[dict[str, str]] = {}
    _pairs: ClassVar[tuple[tuple[str, str, bool], ...]] = ()  # (stored field, domain field, holds stored models)
    _plain: ClassVar[bool] = False  # the domain's fields under the same names, none holding stored models
    _written: ClassVar[dict[str, Any]] = {}  # fields every stored value carries besides the domain's

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.stores is None:
            return
        back = {stored: domain for domain, stored in cls.renamed.items()}
        pairs = [(name, back.get(name, name), _holds_stored(info.annotation))
                 for name, info in cls.model_fields.items() if name not in cls._written]
        named, domain_fields = {domain for _, domain, _ in pairs}, set(cls.stores.model_fields)
        if named != domain_fields:
            raise TypeError(f"{cls.__name__} does not store {cls.stores.__name__} field by field: missing "
                            f"{sorted(domain_fields - named)}, unknown {sorted(named - domain_fields)}")
        cls._pairs = tuple(pairs)
        cls._plain = all(stored == domain and not nested for stored, domain, nested in pairs)
        _STORED[cls.stores] = cls

    def to_domain(self) -> Any:
        """The domain object this stored value stands for."""
        if self.stores is None:
            return self
        values = self.__dict__
        if self._plain:  # (the common case: a copy of the fields, which are the domain's)
            plain = values.copy()
            for name in self._written:
                del plain[name]
            return _construct(self.stores, plain)
        return _construct(self.stores, {domain: _to_domain(values[stored]) if nested else values[stored]
                                        for stored, domain, nested in self._pairs})

    @classmethod
    def of(cls, value: Any) -> StoredModel:
        """The stored form of a domain object."""
        if cls.stores is None:
            return value
        values = value.__dict__
        if cls._plain:
            return _construct(cls, {**cls._written, **values})
        stored = dict(cls._written)
        for name, domain, nested in cls._pairs:
            stored[name] = _to_stored(values[domain]) if nested else values[domain]
        return _construct(cls, stored)


class StateModel(StoredModel):
    """Base of every model kept in keyed state (a value, or a map's entry); `v` names the layout that wrote it."""

    model_config = ConfigDict(extra="forbid")

    v: int = STATE_VERSION
    _written: ClassVar[dict[str, Any]] = {"v": STATE_VERSION}

    @classmethod
    def load(cls, raw: str) -> Any:
        """One stored value, as the domain object the core works with."""
        return parse_stored(cls, raw).to_domain()

    @classmethod
    def dump(cls, value: Any) -> str:
        return cls.of(value).model_dump_json()


class Codec(Protocol):
    """How one named state is kept as text: a StateModel class, or a migration's reader of older entries."""

    def load(self, raw: str) -> Any: ...

    def dump(self, value: Any) -> str: ...


def parse_stored(model: type[M], raw: str) -> M:
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
            f"version {STATE_VERSION}, and moves the older layouts of flink_memory.migrations on restore): restore "
            "with the release that wrote the checkpoint, or start without --restore")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise StateVersionError(f"operator state of {model.__name__} does not parse: {exc}") from None


def stored_model(model: type[BaseModel]) -> type[StoredModel]:
    """The stored model of a domain type (or the stored model itself)."""
    if issubclass(model, StoredModel):
        return model
    if model not in _STORED:
        raise TypeError(f"no stored model stores {model.__name__} (its stage's state schema is not loaded)")
    return _STORED[model]


def load_model(model: type[M], raw: str) -> M:
    """One stored value as `model`: a domain type (through its stored model) or a stored model itself."""
    stored = parse_stored(stored_model(model), raw)
    return stored if isinstance(stored, model) else stored.to_domain()


def dump_model(value: BaseModel) -> str:
    """A domain object (through its stored model) or a stored model, as stored."""
    if isinstance(value, StoredModel):
        return value.model_dump_json()
    return stored_model(type(value)).of(value).model_dump_json()


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
    def get(self, name: str, model: type[M]) -> M | None:
        """The value, as the domain type `model` its stored model converts to (`str` for raw text)."""
        if name not in self._values:
            raw = self.backend.read(name)
            stored = self.schema.values[name]
            self._values[name] = raw if raw is None or stored is None else stored.load(raw)
        return self._values[name]

    def set(self, name: str, value: Any) -> None:
        self._values[name] = value
        self._dirty_values.add(name)

    # maps
    def entry(self, name: str, key: str) -> Any:
        slot = (name, key)
        if slot not in self._entries:
            raw = self.backend.read_entry(name, key)
            stored = self.schema.maps[name]
            self._entries[slot] = raw if raw is None or stored is None else stored.load(raw)
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
