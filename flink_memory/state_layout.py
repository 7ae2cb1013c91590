"""The checkpoint layout of keyed state: versioned stored models, apart from the domain objects they stand for.

A stored model (`StateModel`) is plain data that converts field by field to the domain object a stage core
works with and back, so a domain type can change while checkpoints keep their names. Version 2 is one JSON
object per model with `"v": 2`; an older layout is moved into it by the stage's migration
(flink_memory.migrations); any other version is refused with a clear reason. How a stage reads and writes its
state through these models is flink_memory.state.
"""

from __future__ import annotations

import json
import typing
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
    # fields added to the layout since it was versioned: left out while they hold their default, so a value
    # written before reads and writes back byte for byte
    added: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def load(cls, raw: str) -> Any:
        """One stored value, as the domain object the core works with."""
        return parse_stored(cls, raw).to_domain()

    @classmethod
    def dump(cls, value: Any) -> str:
        stored = cls.of(value)
        if not cls.added:
            return stored.model_dump_json()
        return stored.model_dump_json(exclude={name for name in cls.added
                                               if getattr(stored, name) == cls.model_fields[name].default})


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
